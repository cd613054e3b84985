//===- cpu_loops.cpp - CPU launchers: the shared bodies over a group range -===//
//
// What: each CPU entry point runs the same per-group function the CUDA kernel
// runs, over [begin, end). The caller parallelises by handing out ranges.
//
//===----------------------------------------------------------------------===//
#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace {

struct ForwardRange {
  template <Act A, typename S>
  static void run(const ForwardArgs& a, int64_t b, int64_t e) {
    const ForwardParams<S> p = typed<S>(a);
    for (int64_t g = b; g < e; ++g) forward_group<A, S>(g, p);
  }
};
struct BackwardRange {
  template <Act A, typename S>
  static void run(const BackwardArgs& a, int64_t b, int64_t e) {
    const BackwardParams<S> p = typed<S>(a);
    for (int64_t g = b; g < e; ++g) backward_group<A, S>(g, p);
  }
};
struct FixupRange {
  template <Act A, typename S>
  static void run(const FixupArgs& a, int64_t b, int64_t e) {
    const FixupParams<S> p = typed<S>(a);
    for (int64_t k = b; k < e; ++k) fixup_one<A, S>(k, p);
  }
};

} // namespace

void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t b, int64_t e) {
  dispatch<ForwardRange>(a, t, args, b, e);
}
void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t b, int64_t e) {
  dispatch<BackwardRange>(a, t, args, b, e);
}
void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t b, int64_t e) {
  dispatch<FixupRange>(a, t, args, b, e);
}

} // namespace kernels
} // namespace memslim
