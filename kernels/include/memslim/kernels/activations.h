//===- activations.h - per-activation math, written once for host and device ===//
//
// What: for each activation, the forward (aten's formula, so outputs match
// aten), the reference derivative from the input (aten's backward formula), the
// bit an output-saving backward needs, the "keep exactly" test (guard band
// around a non-monotonic function's minimum), and the derivative recovered from
// the saved output plus that bit.
// Why: one definition feeds the CPU loops, the CUDA kernels and the CPU tests,
// so the tests check the very formulas the GPU runs.
//
// From the output (gelu, silu, mish): in float (fp32 and 16-bit compute), f'
// straight from y and the bit by the generated tables of derivative_tables.h
// (derivative_from_table); in double, inversion. Each branch of the function
// is monotonic; we solve f(x) = y by Newton's method safeguarded by bisection on a bracket that
// is valid for every y (right branch: x in [max(x*, y), max(2y, 0)] because
// x/2 <= f(x) <= x for x >= 0; left branch: in the log domain, where
// log(-f) is increasing and concave, so Newton from the tail converges).
// Near the minimum x* no inverse can be exact (the rounded output carries too
// little information, ../shared/DESIGN.md); elements with |x - x*| < band are
// kept exactly in a sparse list and never inverted. Close to x* (the t-fits'
// range) Newton runs on sign(x - x*) sqrt(f(x) - y*), which stays well
// conditioned through x*; on f itself it stalled there (f' -> 0).
//
// Non-finite and extreme values follow aten's backward formulas: a NaN or
// +-inf input (the only way to a non-finite output of gelu, silu, mish) gets a
// NaN derivative as in aten; finite inputs beyond 1e18 (1e150 in double) go to
// the exact list, since aten's gelu(tanh) backward turns NaN there (x^2
// overflows) while the left branch's output has underflowed to 0; an elu
// output that overflows the dtype goes to the exact list too (its derivative
// is finite in aten). Where aten's backward selects 0 rather than multiplying
// by it (relu, hardsigmoid, hardswish for x <= -3), chain() does the same, so
// a NaN grad_out stays 0 there as in aten.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/activations_closed_form.h"
#include "memslim/kernels/activations_inversion.h"
#include "memslim/kernels/activations_inverted.h"
#include "memslim/kernels/activations_params.h"
#include "memslim/kernels/hd.h"

namespace memslim {
namespace kernels {

// dL/dx from dL/dy and f'(x), as aten combines them: a product, except that
// aten's relu (threshold_backward), hardsigmoid and hardswish (x <= -3)
// backward kernels select 0 instead of multiplying by it, so a NaN or inf
// grad_out gives 0 there. For hardswish f' = 0 from the output only for
// x <= -3 (x* itself lies in the guard band and goes through the exact list).
template <Act A>
constexpr bool chain_selects_zero() {
  return A == Act::Relu || A == Act::Hardsigmoid || A == Act::Hardswish;
}
template <Act A, typename T>
MEMSLIM_HD T chain(T g, T d) {
  if (chain_selects_zero<A>()) return d == T(0) ? T(0) : g * d;
  return g * d;
}
// The same from the input (exact-list elements).
template <Act A, typename T>
MEMSLIM_HD T chain_from_input(T g, T x, const ActParams& p) {
  const T d = ActMath<A>::grad_from_input(x, p);
  if (A == Act::Hardswish) return x <= T(-3) ? T(0) : g * d;
  return chain<A, T>(g, d);
}

} // namespace kernels
} // namespace memslim
