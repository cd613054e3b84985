//===- cpu_dispatch.cpp - pick the CPU loops for this processor ------------===//
//
// What: the public CPU entry points of launch.h forward to the AVX2+FMA build of
// the loops when the processor has both (checked once), else to the baseline
// build. Both builds compute the same per-element math.
//
//===----------------------------------------------------------------------===//
#include "memslim/kernels/launch.h"

namespace memslim {
namespace kernels {

#define MEMSLIM_DECLARE_CPU(NS)                                                                 \
  namespace NS {                                                                                \
  void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t b, int64_t e);              \
  void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t b, int64_t e);            \
  void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t b, int64_t e);                  \
  void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S, \
                             int64_t b, int64_t e);                                             \
  void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t b,       \
                             int64_t e);                                                        \
  }
MEMSLIM_DECLARE_CPU(baseline)
#ifdef MEMSLIM_HAVE_AVX2_LOOPS
MEMSLIM_DECLARE_CPU(avx2)
#endif
#undef MEMSLIM_DECLARE_CPU

namespace {
bool use_avx2() {
#ifdef MEMSLIM_HAVE_AVX2_LOOPS
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}
} // namespace

#ifdef MEMSLIM_HAVE_AVX2_LOOPS
#define MEMSLIM_PICK(FN, ...) (use_avx2() ? avx2::FN(__VA_ARGS__) : baseline::FN(__VA_ARGS__))
#else
#define MEMSLIM_PICK(FN, ...) baseline::FN(__VA_ARGS__)
#endif

void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t b, int64_t e) {
  MEMSLIM_PICK(forward_cpu, a, t, args, b, e);
}
void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t b, int64_t e) {
  MEMSLIM_PICK(backward_cpu, a, t, args, b, e);
}
void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t b, int64_t e) {
  MEMSLIM_PICK(fixup_cpu, a, t, args, b, e);
}
void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S,
                           int64_t b, int64_t e) {
  MEMSLIM_PICK(relu_join_forward_cpu, t, y, r, cmax, C, S, b, e);
}
void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t b, int64_t e) {
  MEMSLIM_PICK(relu_join_rebuild_cpu, t, y, out, r, b, e);
}

} // namespace kernels
} // namespace memslim
