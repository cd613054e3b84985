//===- launch.h - torch-free entry points of memslim_kernels ----------------===//
//
// What: type-erased arguments and the CPU / CUDA launchers the runtime calls
// with raw pointers. CPU launchers process a range [begin, end) of groups (or
// exact-list entries) so the caller can spread ranges over its own thread pool
// (the runtime uses at::parallel_for; kernels/ stays free of torch). CUDA
// launchers run a grid-stride kernel on the given stream.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>

#include "memslim/kernels/activations.h"

typedef struct CUstream_st* cudaStream_t;

namespace memslim {
namespace kernels {

enum class DType : int { Float, Double, Half, BFloat16 };

struct ForwardArgs {
  const void* x = nullptr;
  void* y = nullptr;
  uint8_t* bits = nullptr;
  int64_t n = 0;
  ActParams act;
  int32_t* exact_idx = nullptr;
  void* exact_val = nullptr;
  unsigned long long* exact_count = nullptr;
  int64_t exact_cap = 0;
};

struct BackwardArgs {
  const void* grad = nullptr;
  const void* y = nullptr;
  const uint8_t* bits = nullptr;
  void* grad_in = nullptr;
  int64_t n = 0;
  ActParams act;
};

struct FixupArgs {
  const int32_t* idx = nullptr;
  const void* val = nullptr;
  const void* grad = nullptr;
  void* grad_in = nullptr;
  int64_t count = 0;
  ActParams act;
};

// Number of 8-element groups (= bytes of packed bits) for n elements.
inline int64_t groups_for(int64_t n) { return (n + 7) / 8; }

void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t g_begin, int64_t g_end);
void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t g_begin, int64_t g_end);
void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t k_begin, int64_t k_end);

// ResNet's residual join with a ReLU, for float / double (`t`): rows
// [row_begin, row_end) of a contiguous (A, C, S) tensor, row = a * C + c.
// Forward: y += relu(r) in place, and cmax[c] = max(cmax[c], relu(r) over the
// row) (NaN propagates, as aten's amax). relu(v) is aten's clamp_min(v, 0)
// value for value: v < 0 ? +0 : v. Rebuild (the backward): y = out - relu(r).
void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S,
                           int64_t row_begin, int64_t row_end);
void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t begin,
                           int64_t end);
// The same forward for a join whose activation `a` was computed already (by
// aten): y += a in place (the same IEEE sum as a + y) and cmax[c] =
// max(cmax[c], |a| over the row), NaN-propagating as aten's abs + amax.
void add_join_forward_cpu(DType t, void* y, const void* a, void* cmax, int64_t C, int64_t S,
                          int64_t row_begin, int64_t row_end);

// gelu (erf form) of x[begin, end) into y and its derivative into d, float /
// double, in one pass sharing one exp: aten's gelu and gelu_backward formulas
// (float: with aten's vectorised erf form; d(+-inf) is NaN as aten's). For the recomputes of the
// ops that keep gelu's input (act-consumers, joins): one pass instead of aten's gelu and
// gelu_backward. Returns whether the range holds an x that is NaN, infinite or beyond 2^120, where
// aten's vectorised gelu is not its own formula (gelu(+inf) NaN, gelu(3e38) inf): the caller takes
// such values from aten instead.
bool gelu_value_derivative_cpu(DType t, const void* x, void* y, void* d, int64_t begin,
                               int64_t end);

// The loss head's rows (linear_cross_entropy): `z` holds rows x vocab logits,
// row-major, fp32 or bf16 (`t`). For rows [row_begin, row_end): lse[r], the
// logit at target[r] (a valid index: ignored rows carry any) in picked[r] and,
// where zsum is given, the sum of the row's logits in zsum[r]; where scale is
// given, the row is overwritten by the logits' gradient scale[r] * (softmax -
// (1 - eps) * onehot(target) - eps / vocab), NaN where lse[r] is not finite.
struct SoftmaxRowsArgs {
  void* z = nullptr;
  int64_t vocab = 0;
  const int64_t* target = nullptr;
  const float* scale = nullptr;
  float eps = 0;
  float* lse = nullptr;
  float* picked = nullptr;
  float* zsum = nullptr;
};
void softmax_rows_cpu(DType t, const SoftmaxRowsArgs& args, int64_t row_begin, int64_t row_end);

// Whether this processor runs a vector build of the CPU loops (AVX2 or AVX-512;
// MEMSLIM_CPU_LOOPS=baseline says no). Callers choosing between a kernels pass
// and aten's ops ask it where the scalar build is slower than aten's vectorised
// ops (gelu_value_derivative_cpu: ~12 ns per element scalar against aten's ~1.3).
bool cpu_loops_vectorised();

// Present only in builds with CUDA (MEMSLIM_WITH_CUDA).
void forward_cuda(Act a, DType t, const ForwardArgs& args, cudaStream_t stream);
void backward_cuda(Act a, DType t, const BackwardArgs& args, cudaStream_t stream);
void fixup_cuda(Act a, DType t, const FixupArgs& args, cudaStream_t stream);

} // namespace kernels
} // namespace memslim
