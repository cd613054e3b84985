//===- activations_params.h - the activation enum and call parameters ---===//
//
// What: the kernel activations' enum (activation_table.def's rows), one call's parameters,
// what each backward keeps, which calls store a bit or an exact list, and the ActMath
// template the per-activation headers specialise.
// Why: the common ground of activations.h's topic headers (included through activations.h).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/hd.h"

namespace memslim {
namespace kernels {

// One enumerator per kernel activation, in activation_table.def's order
// (parameters: the table's names column; celu and selu run Elu).
enum class Act : int {
#define MEMSLIM_ACT(ENUM, NAME, SAVE, NPARAMS, PARAM_NAMES) ENUM,
#include "memslim/kernels/activation_table.def"
  NumActs
};

// Parameters of one activation call. `bits` says whether a branch/mask bit is
// stored; `band` is the guard-band half-width for the exact list (0 = none).
// Saved-value overflow: the caller saves y * out_scale (activation_dropout's
// 1/(1-p); else 1) in the storage dtype, which rounds to inf from out_max on
// (the rounding boundary: 65520 for fp16; inf for fp32/fp64, where compute
// and storage agree). A finite x whose saved value overflows is kept exactly
// by the activations with an exact list; `keep_overflow` gives elu such a list
// where its parameters allow overflow (elu_may_overflow).
struct ActParams {
  double p0 = 0, p1 = 0, p2 = 0;
  double band = 0;
  bool bits = false;
  bool keep_overflow = false;
  double out_scale = 1;
  double out_max = INFINITY;
};

// What the backward of an activation keeps.
enum class SaveKind : int {
  Output,          // y only (sigmoid, tanh; elu/softplus unless params need a bit)
  OutputBitsExact, // y + branch bit + exact list near the minimum (non-monotonic)
  Mask             // 1 bit only: the derivative does not depend on y
};

MEMSLIM_HD constexpr SaveKind save_kind(Act a) {
  switch (a) {
#define MEMSLIM_ACT(ENUM, NAME, SAVE, NPARAMS, PARAM_NAMES) \
  case Act::ENUM:                                           \
    return SaveKind::SAVE;
#include "memslim/kernels/activation_table.def"
    default:
      return SaveKind::Output;
  }
}

// Whether a bit is stored for these parameters. Elu needs one when its
// negative branch can reach positive outputs; softplus when its threshold is so
// low that the linear region's derivative (1) differs from the smooth branch's
// 1 - exp(-beta*y) by more than 1e-6 (exp(-14) = 8.3e-7).
inline bool act_uses_bits(Act a, double p0, double p1, double p2) {
  switch (save_kind(a)) {
    case SaveKind::OutputBitsExact:
    case SaveKind::Mask:
      return true;
    default:
      break;
  }
  if (a == Act::Elu) return !(p0 >= 0 && p1 > 0 && p2 >= 0);
  if (a == Act::Softplus) return !(p1 >= 14.0);
  return false;
}

// Whether elu(alpha, scale, input_scale) can overflow a dtype whose largest
// finite value is out_max at a finite x, with a finite derivative there. Only
// the negative branch matters (the positive one's derivative, `scale`, comes
// from the bit or the sign): y = alpha*scale*expm1(input_scale*x), x <= 0, is
// bounded by |alpha*scale| when input_scale >= 0 and unbounded when < 0.
// fp16 reaches it with alpha >= 65504 (celu(x, 1e5)) or input_scale < 0.
inline bool elu_may_overflow(double alpha, double scale, double input_scale, double out_max) {
  return input_scale < 0 || !(std::fabs(alpha * scale) < out_max);
}

// Whether the forward builds an exact list (input values kept for elements
// whose derivative the saved output cannot give): the guard band and extreme
// inputs of the non-monotonic activations, overflowed elu outputs.
MEMSLIM_HD bool act_has_exact_list(Act a, const ActParams& p) {
  return save_kind(a) == SaveKind::OutputBitsExact || (a == Act::Elu && p.keep_overflow);
}

// Per-activation definitions, specialised in activations_inverted.h and
// activations_closed_form.h. T is the compute type (float or double).
template <Act A>
struct ActMath;

} // namespace kernels
} // namespace memslim
