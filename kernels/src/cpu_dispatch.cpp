//===- cpu_dispatch.cpp - pick the CPU loops for this processor ------------===//
//
// What: the public CPU entry points of launch.h forward to the AVX-512 build of
// the loops where the processor has it, else the AVX2+FMA build, else the
// baseline build (checked once). All compute the same per-element math.
//
//===----------------------------------------------------------------------===//
#include <cstdlib>
#include <string>

#include "memslim/kernels/launch.h"
#include "memslim/kernels/region_vm.h"

namespace memslim {
namespace kernels {

#define MEMSLIM_DECLARE_CPU(NS)                                                                   \
  namespace NS {                                                                                  \
  void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t b, int64_t e);                \
  void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t b, int64_t e);              \
  void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t b, int64_t e);                    \
  void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S,   \
                             int64_t b, int64_t e);                                               \
  void add_join_forward_cpu(DType t, void* y, const void* a, void* cmax, int64_t C, int64_t S,    \
                            int64_t b, int64_t e);                                                \
  void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t b,         \
                             int64_t e);                                                          \
  bool gelu_value_derivative_cpu(DType t, const void* x, void* y, void* d, int64_t b, int64_t e); \
  void softmax_rows_cpu(DType t, const SoftmaxRowsArgs& args, int64_t b, int64_t e);              \
  namespace region {                                                                              \
  void region_forward_cpu(const kernels::region::Program& p,                                      \
                          const kernels::region::ForwardCall& c, int64_t b, int64_t e);           \
  void region_backward_cpu(const kernels::region::Program& p,                                     \
                           const kernels::region::BackwardCall& c, int64_t b, int64_t e);         \
  }                                                                                               \
  }
MEMSLIM_DECLARE_CPU(baseline)
#ifdef MEMSLIM_HAVE_AVX2_LOOPS
MEMSLIM_DECLARE_CPU(avx2)
#endif
#ifdef MEMSLIM_HAVE_AVX512_LOOPS
MEMSLIM_DECLARE_CPU(avx512)
#endif
#undef MEMSLIM_DECLARE_CPU

namespace {
// Which build of the loops this processor runs, checked once. The
// MEMSLIM_CPU_LOOPS environment variable (baseline, avx2, avx512) caps it, so
// tests and benchmarks can compare the builds on one machine.
enum class Isa { Baseline, Avx2, Avx512 };
Isa detect_isa() {
  Isa best = Isa::Baseline;
#ifdef MEMSLIM_HAVE_AVX2_LOOPS
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    best = Isa::Avx2;
#endif
#ifdef MEMSLIM_HAVE_AVX512_LOOPS
  if (best == Isa::Avx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    best = Isa::Avx512;
#endif
  if (const char* cap = std::getenv("MEMSLIM_CPU_LOOPS")) {
    const std::string c(cap);
    if (c == "baseline")
      best = Isa::Baseline;
    else if (c == "avx2" && best == Isa::Avx512)
      best = Isa::Avx2;
  }
  return best;
}
Isa isa() {
  static const Isa i = detect_isa();
  return i;
}
} // namespace

#if defined(MEMSLIM_HAVE_AVX512_LOOPS)
#define MEMSLIM_PICK(FN, ...)                     \
  (isa() == Isa::Avx512 ? avx512::FN(__VA_ARGS__) \
   : isa() == Isa::Avx2 ? avx2::FN(__VA_ARGS__)   \
                        : baseline::FN(__VA_ARGS__))
#elif defined(MEMSLIM_HAVE_AVX2_LOOPS)
#define MEMSLIM_PICK(FN, ...) \
  (isa() == Isa::Avx2 ? avx2::FN(__VA_ARGS__) : baseline::FN(__VA_ARGS__))
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
void add_join_forward_cpu(DType t, void* y, const void* a, void* cmax, int64_t C, int64_t S,
                          int64_t b, int64_t e) {
  MEMSLIM_PICK(add_join_forward_cpu, t, y, a, cmax, C, S, b, e);
}
void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t b, int64_t e) {
  MEMSLIM_PICK(relu_join_rebuild_cpu, t, y, out, r, b, e);
}
bool gelu_value_derivative_cpu(DType t, const void* x, void* y, void* d, int64_t b, int64_t e) {
  return MEMSLIM_PICK(gelu_value_derivative_cpu, t, x, y, d, b, e);
}
void softmax_rows_cpu(DType t, const SoftmaxRowsArgs& args, int64_t b, int64_t e) {
  MEMSLIM_PICK(softmax_rows_cpu, t, args, b, e);
}
bool cpu_loops_vectorised() { return isa() != Isa::Baseline; }

namespace region {
void region_forward_cpu(const Program& p, const ForwardCall& c, int64_t b, int64_t e) {
  MEMSLIM_PICK(region::region_forward_cpu, p, c, b, e);
}
void region_backward_cpu(const Program& p, const BackwardCall& c, int64_t b, int64_t e) {
  MEMSLIM_PICK(region::region_backward_cpu, p, c, b, e);
}
} // namespace region

} // namespace kernels
} // namespace memslim
