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

#include "memslim/kernels/derivative_tables.h"
#include "memslim/kernels/hd.h"
#include "memslim/kernels/inverse_fits.h"

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

namespace detail {

template <typename T>
MEMSLIM_HD T sigmoid(T x) {
  return T(1) / (T(1) + m::exp(-x));
}

// Minimum of a non-monotonic activation: location, value, curvature (mpmath,
// 40 digits), and the tail guess used for the left branch.
struct MinInfo {
  double x, y, curv;
};

// Accurate f, f' and f'' used only for inversion (erfc / sigmoid forms that
// keep relative accuracy in the left tail where aten's forward formula
// cancels). f'' lets one Newton step also correct the derivative.
template <Act A, typename T>
MEMSLIM_HD void eval_accurate(T x, T& f, T& fp, T& fpp);

template <typename T>
MEMSLIM_HD void eval_gelu(T x, T& f, T& fp, T& fpp) {
  T cdf = T(0.5) * m::erfc(-x * T(0.70710678118654752440));
  T pdf = m::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
  f = x * cdf;
  fp = cdf + x * pdf;
  fpp = pdf * (T(2) - x * x);
}
template <typename T>
MEMSLIM_HD void eval_gelu_tanh(T x, T& f, T& fp, T& fpp) {
  const T k = T(0.79788456080286535588), kap = T(0.044715);
  T u = k * (x + kap * x * x * x);
  T du = k * (T(1) + T(3) * kap * x * x);
  T d2u = T(6) * k * kap * x;
  T s2 = sigmoid(T(2) * u); // (1 + tanh(u)) / 2 without cancellation
  T q = s2 * (T(1) - s2);
  f = x * s2;
  fp = s2 + T(2) * x * q * du;
  fpp = T(4) * q * du + T(4) * x * (T(1) - T(2) * s2) * q * du * du + T(2) * x * q * d2u;
}
template <typename T>
MEMSLIM_HD void eval_silu(T x, T& f, T& fp, T& fpp) {
  T s = sigmoid(x);
  f = x * s;
  fp = s * (T(1) + x * (T(1) - s));
  fpp = s * (T(1) - s) * (T(2) + x * (T(1) - T(2) * s));
}
template <typename T>
MEMSLIM_HD void eval_mish(T x, T& f, T& fp, T& fpp) {
  const T sp_smooth = m::log1p(m::exp(x)); // computed unconditionally: vectorises
  T sp = x > T(20) ? x : sp_smooth;
  T t = m::tanh(sp);
  T s = sigmoid(x);
  T w = s * (T(1) - t * t);
  f = x * t;
  fp = t + x * w;
  fpp = w * (T(2) + x * (T(1) - s) - T(2) * x * s * t);
}
#define MEMSLIM_EVAL(ACT, FN)                                                                     \
  template <>                                                                                     \
  MEMSLIM_HD void eval_accurate<Act::ACT, float>(float x, float& f, float& fp, float& fpp) {      \
    FN(x, f, fp, fpp);                                                                            \
  }                                                                                               \
  template <>                                                                                     \
  MEMSLIM_HD void eval_accurate<Act::ACT, double>(double x, double& f, double& fp, double& fpp) { \
    FN(x, f, fp, fpp);                                                                            \
  }
MEMSLIM_EVAL(Gelu, eval_gelu)
MEMSLIM_EVAL(GeluTanh, eval_gelu_tanh)
MEMSLIM_EVAL(Silu, eval_silu)
MEMSLIM_EVAL(Mish, eval_mish)
#undef MEMSLIM_EVAL

template <Act A>
MEMSLIM_HD MinInfo min_info() {
  switch (A) {
    case Act::Gelu:
      return {-0.75179152469356445747, -0.16997120747990366169, 0.43149399231404691979};
    case Act::GeluTanh:
      return {-0.75246142207101625849, -0.17004075057125405064, 0.43040009102485850908};
    case Act::Silu:
      return {-1.2784645427610737951, -0.27846454276107379511, 0.21781170571980009878};
    case Act::Mish:
      return {-1.1924312145154952121, -0.30884341301725040663, 0.26694791404953451132};
    default:
      return {-1.5, -0.375, 1.0 / 3.0}; // hardswish
  }
}

// Left-tail first guess for x given a tiny negative y.
template <Act A, typename T>
MEMSLIM_HD T tail_guess(T y) {
  if (A == Act::Gelu || A == Act::GeluTanh) {
    // -y ~ phi(x) for x -> -inf.
    T a = -m::log(-y * T(2.5066282746310002));
    return a > T(0) ? -m::sqrt(T(2) * a) : T(-2);
  }
  // silu / mish: -y ~ |x| e^x.
  T L = m::log(-y);
  return L < T(-1) ? L - m::log(-L) : T(-2);
}

template <Act A>
struct FitFor;
#define MEMSLIM_FITS(ACT)           \
  template <>                       \
  struct FitFor<Act::ACT> {         \
    using Right = fits::ACT##Right; \
    using Left = fits::ACT##Left;   \
    using Tail = fits::ACT##Tail;   \
  };
MEMSLIM_FITS(Gelu)
MEMSLIM_FITS(GeluTanh)
MEMSLIM_FITS(Silu)
MEMSLIM_FITS(Mish)
#undef MEMSLIM_FITS

template <typename T>
struct iter_limits;
// `huge`: inputs beyond it go to the exact list (below aten's gelu(tanh)
// overflow, |x| > 1.8e19 in float, 1.3e154 in double); `eps`: unit roundoff.
template <>
struct iter_limits<float> {
  static constexpr int max_iter = 8;
  static constexpr float rel_tol = 1e-6f; // f' error <= f'' * tol: ~4e-7
  static constexpr float floor_x = -120.f;
  static constexpr float huge = 1e18f;
  static constexpr float finite_max = 3.40282346638528859812e+38f;
  static constexpr float eps = 1.1920929e-7f;
};
template <>
struct iter_limits<double> {
  static constexpr int max_iter = 12;
  static constexpr double rel_tol = 1e-12;
  static constexpr double floor_x = -1000.0;
  static constexpr double huge = 1e150;
  static constexpr double finite_max = 1.7976931348623157e+308;
  static constexpr double eps = 2.220446049250313e-16;
};

// Newton from a first guess, safeguarded by bisection on [lo, hi]; returns
// f' at the last evaluated point once the step is below tolerance (that point
// is within one step of the root, so f' there is off by f'' * step at most).
template <Act A, typename T>
MEMSLIM_HD T newton_derivative(T x, T y, T lo, T hi) {
  using L = iter_limits<T>;
  x = m::min(m::max(x, lo), hi); // a guess on the bracket's edge is still a guess
  T f, fp, fpp;
  for (int it = 0; it < L::max_iter; ++it) {
    eval_accurate<A, T>(x, f, fp, fpp);
    const T r = f - y;
    if (r == T(0)) return fp;
    const T step = r / fp;
    // Converged: x is within one (tiny) step of the root. Checked before the
    // bracket update, which would otherwise turn a zero step into a bisection.
    if (m::fabs(step) <= L::rel_tol * (T(1) + m::fabs(x))) return fp;
    if ((r < T(0)) == (fp > T(0)))
      lo = x;
    else
      hi = x;
    T xn = x - step;
    if (!(xn >= lo && xn <= hi)) xn = T(0.5) * (lo + hi);
    x = xn;
  }
  eval_accurate<A, T>(x, f, fp, fpp);
  return fp;
}

// Newton on h(x) = sign(x - x*) sqrt(f(x) - y*) = s, s = +-sqrt(y - y*) (+ on
// the right branch), safeguarded by bisection on [lo, hi] (h increases on
// it). Near the minimum Newton on f - y stalls, f' -> 0: a first guess within
// the fit's error of x* (or clamped onto it) took the bisection fallback and
// ran out of iterations, fp64 gradients off by 1.8e-4 at |x - x*| = 1e-6. h is
// monotonic through x* with h'(x*) = sqrt(f''(x*)/2) != 0, so Newton converges
// quadratically from either side. h' = |f'| / (2 sqrt(f - y*)), replaced by
// h'(x*) where f - y* is within rounding noise of 0. Returns f' at the root,
// carried over the last step by f''.
// Whether the saved value y * out_scale overflows the storage dtype while x is
// finite (ActParams): the derivative is finite but y no longer tells it.
template <typename T>
MEMSLIM_HD bool saved_overflows(T x, T y, const ActParams& p) {
  return (m::fabs(y * T(p.out_scale)) >= T(p.out_max)) & (m::fabs(x) <= iter_limits<T>::finite_max);
}

template <Act A, typename T>
MEMSLIM_HD T sqrt_newton_derivative(T x, T s, T lo, T hi) {
  using L = iter_limits<T>;
  const MinInfo mi = min_info<A>();
  const T xs = T(mi.x), ys = T(mi.y);
  const T slope0 = m::sqrt(T(0.5) * T(mi.curv));
  const T d_floor = T(16) * L::eps * m::fabs(ys);
  x = m::min(m::max(x, lo), hi);
  T f, fp, fpp;
  for (int it = 0; it < L::max_iter; ++it) {
    eval_accurate<A, T>(x, f, fp, fpp);
    const T D = m::max(f - ys, T(0));
    const T r = m::sqrt(D);
    const T h = x < xs ? -r : r;
    const T dh = D > d_floor ? m::fabs(fp) / (T(2) * r) : slope0;
    const T step = (h - s) / dh;
    if (m::fabs(step) <= L::rel_tol * (T(1) + m::fabs(x))) return fp - fpp * step;
    if (h < s)
      lo = x;
    else
      hi = x;
    T xn = x - step;
    if (!(xn >= lo && xn <= hi)) xn = T(0.5) * (lo + hi);
    x = xn;
  }
  eval_accurate<A, T>(x, f, fp, fpp);
  return fp;
}

// From a fitted guess (error <= 1.5e-4 in x, double only: float takes
// derivative_from_table), Newton to full precision. With `near_min` (the
// t-fits, either side of x*; `right`: the branch) it runs on the square-root
// form (sqrt_newton_derivative); the tail fit's is Newton on f.
template <Act A, typename T>
MEMSLIM_HD T fitted_derivative(T x, T y, T lo, T hi, bool near_min = false, bool right = false) {
  if (near_min) {
    const T t = m::sqrt(y - T(min_info<A>().y));
    return sqrt_newton_derivative<A, T>(x, right ? t : -t, lo, hi);
  }
  return newton_derivative<A, T>(x, y, lo, hi);
}

// derivative_tables.h's table of `Pieces` pieces for A (8: the AVX2 loops;
// 32: the AVX-512 loops and derivative_from_table).
template <Act A, int Pieces>
struct DerivFor;
#define MEMSLIM_DERIV(ACT)             \
  template <>                          \
  struct DerivFor<Act::ACT, 8> {       \
    using type = tables::ACT##Deriv8;  \
  };                                   \
  template <>                          \
  struct DerivFor<Act::ACT, 32> {      \
    using type = tables::ACT##Deriv32; \
  };
MEMSLIM_DERIV(Gelu)
MEMSLIM_DERIV(GeluTanh)
MEMSLIM_DERIV(Silu)
MEMSLIM_DERIV(Mish)
#undef MEMSLIM_DERIV

// fp32: f'(x) straight from y and the branch bit, one polynomial of
// derivative_tables.h per element (no inversion, no erfc / exp): error
// <= 1.5e-7 against float64 for every finite y (the table's max error), so
// within aten's own fp32 backward error. Right branch: pieces in t =
// sqrt(y - y*), f' = 1 beyond the table; left: pieces in t down to kLeftEnd,
// then the tail, f' = y * p(w), w = sqrt(-2 log(-y)) clamped at the table's
// far end (|f'| < 1e-14 there; an underflowed y = 0 gives 0). At or below
// y* (rounding): f'(x*) = 0 exactly. Non-finite y is the caller's (NaN, as aten).
// The CPU loops evaluate the same tables 8 (AVX2, 8 pieces) / 16 (AVX-512,
// 32 pieces) lanes at a time (cpu_loops_impl.h).
template <Act A, int Pieces = 32>
MEMSLIM_HD float derivative_from_table(float y, bool right) {
  using D = typename DerivFor<A, Pieces>::type;
  // y - y* with y* as a float pair: y - ys is exact near the minimum
  // (Sterbenz), so only y's own rounding is left (float(y*) alone is off by
  // up to 1.5e-8, which moved f' by 3e-7 at |x - x*| = 0.05).
  const float ys = float(min_info<A>().y);
  const float ys_lo = float(min_info<A>().y - double(ys));
  const float t = m::sqrt(m::max((y - ys) - ys_lo, 0.f));
  const bool tail = !right & (y > D::kLeftEnd);
  const float w = m::sqrt(m::max(-2.f * fast_log(m::max(-y, 1e-30f)), 0.f));
  const float v = tail ? w : t;
  const float v0 = right ? D::kV0Right : tail ? D::kV0Tail : D::kV0Left;
  const float scale = right ? D::kScaleRight : tail ? D::kScaleTail : D::kScaleLeft;
  const float pieces = right ? D::kPiecesRight : tail ? D::kPiecesTail : D::kPiecesLeft;
  const float base = right ? D::kBaseRight : tail ? D::kBaseTail : D::kBaseLeft;
  const float u = m::min(m::max((v - v0) * scale, 0.f), pieces);
  const float j = m::min(float(int(u)), pieces - 1.f);
  const float s = 2.f * (u - j) - 1.f;
  const int p = int(base + j);
  float acc = D::coef(D::kDegree * D::kPieces + p);
  for (int k = D::kDegree - 1; k >= 0; --k) acc = m::fma(acc, s, D::coef(k * D::kPieces + p));
  float d = tail ? y * acc + 0.f : acc; // + 0: an underflowed -0.0 gives +0
  d = (right & (y > D::kRightEnd)) ? 1.f : d;
  return t > 0.f ? d : 0.f;
}

// f'(x) at the x with f(x) = y on the chosen branch (right: x >= x*).
// First guesses: the generated Chebyshev fits in t = sqrt(y - y*), and on the
// left tail in w = sqrt(-2 log(-y)) (good to <= 1.5e-4 in x, so one or two
// Newton steps reach working precision); right of the fitted range x = y;
// beyond the tail fit (gelu x < -8, silu/mish x < -30: outputs of 1e-15 and
// less) the tail asymptote and Newton on log(-f), where the function is smooth.
template <Act A, typename T>
MEMSLIM_HD T derivative_by_inversion(T y, bool right) {
  using Fit = FitFor<A>;
  using L = iter_limits<T>;
  // A NaN or +-inf input (the only way to a non-finite output): aten's
  // formulas give NaN (inf * 0, NaN arithmetic), and so does this.
  if (!(m::fabs(y) <= L::finite_max)) return T(NAN);
  if constexpr (sizeof(T) == sizeof(float)) return derivative_from_table<A>(y, right);
  const MinInfo mi = min_info<A>();
  const T xs = T(mi.x), ys = T(mi.y);
  if (!(y > ys)) return T(0); // at (or rounded below) the minimum: f'(x*) = 0
  T f, fp, fpp;
  if (right) {
    if (y == T(0)) { // x = 0 exactly
      eval_accurate<A, T>(T(0), f, fp, fpp);
      return fp;
    }
    T lo = y > T(0) ? y : xs;
    const T hi = y > T(0) ? T(2) * y : T(0);
    if (lo < xs) lo = xs;
    if (y <= T(Fit::Right::y_end))
      return fitted_derivative<A, T>(Fit::Right::guess(m::sqrt(y - ys)), y, lo, hi, true, true);
    return newton_derivative<A, T>(y, y, lo, hi);
  }
  if (!(y < T(0))) return T(0); // underflowed output: f'(x) ~ 0 that far out
  if (y <= T(Fit::Left::y_end)) {
    return fitted_derivative<A, T>(Fit::Left::guess(m::sqrt(y - ys)), y,
                                   T(Fit::Tail::x_end) - T(0.5), xs, true, false);
  }
  if (y <= T(Fit::Tail::y_end)) {
    return fitted_derivative<A, T>(Fit::Tail::guess(m::sqrt(T(-2) * m::log(-y))), y,
                                   T(Fit::Tail::x_end) - T(0.5), xs);
  }
  // Far left tail: solve g(x) = log(-f(x)) = log(-y), g' = f'/f.
  const T t = m::log(-y);
  T lo = T(L::floor_x), hi = T(Fit::Tail::x_end) + T(0.5);
  T x = tail_guess<A, T>(y);
  if (!(x > lo && x < hi)) x = T(0.5) * (lo + hi);
  for (int it = 0; it < 4 * L::max_iter; ++it) {
    eval_accurate<A, T>(x, f, fp, fpp);
    const T r = m::log(-f) - t;
    if (r == T(0)) return fp;
    const T step = r * f / fp;
    if (m::fabs(step) <= L::rel_tol * (T(1) + m::fabs(x))) return fp;
    if (r < T(0))
      lo = x;
    else
      hi = x; // g increases with x
    T xn = x - step;
    if (!(xn > lo && xn < hi)) xn = T(0.5) * (lo + hi);
    x = xn;
  }
  eval_accurate<A, T>(x, f, fp, fpp);
  return fp;
}

} // namespace detail

// ---------------------------------------------------------------------------
// Per-activation definitions. T is the compute type (float or double).
// ---------------------------------------------------------------------------
template <Act A>
struct ActMath;

// Shared by gelu, gelu(tanh), silu and mish: the branch bit (x >= x*), the
// guard band around x*, and the derivative by inversion of the saved output.
template <Act A>
struct InvertedAtMinimum {
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return !(x < T(detail::min_info<A>().x));
  }
  // Kept exactly: the guard band around x*, finite inputs beyond `huge`, and
  // (activation_dropout) those whose scaled output overflows the dtype.
  template <typename T>
  MEMSLIM_HD static bool exact(T x, T y, const ActParams& p) {
    using L = detail::iter_limits<T>;
    const T ax = m::fabs(x);
    return (m::fabs(x - T(detail::min_info<A>().x)) < T(p.band)) |
           ((ax > L::huge) & (ax <= L::finite_max)) | detail::saved_overflows(x, y, p);
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool b, const ActParams&) {
    return detail::derivative_by_inversion<A, T>(y, b);
  }
};

template <>
struct ActMath<Act::Gelu> : InvertedAtMinimum<Act::Gelu> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return x * T(0.5) * (T(1) + m::erf(x * T(0.70710678118654752440)));
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    T cdf = T(0.5) * (T(1) + m::erf(x * T(0.70710678118654752440)));
    T pdf = m::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
    return cdf + x * pdf;
  }
};

template <>
struct ActMath<Act::GeluTanh> : InvertedAtMinimum<Act::GeluTanh> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    const T k = T(0.79788456080286535588), kap = T(0.044715);
    return T(0.5) * x * (T(1) + m::tanh(k * (x + kap * x * x * x)));
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    const T k = T(0.79788456080286535588), kap = T(0.044715);
    T x2 = x * x;
    T inner = k * (x + kap * x2 * x);
    T t = m::tanh(inner);
    T left = T(0.5) * x, right = T(1) + t;
    T left_d = T(0.5), right_d = (T(1) - t * t) * k * (T(1) + T(3) * kap * x2);
    return left * right_d + left_d * right;
  }
};

template <>
struct ActMath<Act::Silu> : InvertedAtMinimum<Act::Silu> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return x / (T(1) + m::exp(-x));
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    T s = T(1) / (T(1) + m::exp(-x));
    return s * (T(1) + x * (T(1) - s));
  }
};

template <>
struct ActMath<Act::Mish> : InvertedAtMinimum<Act::Mish> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return x * m::tanh(m::log1p(m::exp(x)));
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    T sig = T(1) / (T(1) + m::exp(-x));
    T tsp = m::tanh(m::log1p(m::exp(x)));
    return tsp + x * sig * (T(1) - tsp * tsp);
  }
};

template <>
struct ActMath<Act::Softplus> {
  // bit: x*beta > threshold (the linear region).
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams& p) {
    T beta = T(p.p0), th = T(p.p1);
    const T smooth = m::log1p(m::exp(x * beta)) / beta; // unconditional: vectorises
    return (x * beta) > th ? x : smooth;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams& p) {
    T beta = T(p.p0), th = T(p.p1);
    const T z = m::exp(x * beta);
    const T smooth = z / (z + T(1));
    return (x * beta) > th ? T(1) : smooth;
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams& p) {
    return (x * T(p.p0)) > T(p.p1);
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  // Without a bit (threshold >= 14) the smooth formula serves the linear
  // region too: 1 - exp(-beta*y) differs from 1 by < exp(-threshold).
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool b, const ActParams& p) {
    if (p.bits && b) return T(1);
    return -m::expm1(-T(p.p0) * y); // sigmoid(beta*x) = 1 - exp(-beta*y)
  }
};

template <>
struct ActMath<Act::Elu> {
  // y = x > 0 ? scale*x : scale*alpha*(exp(input_scale*x) - 1); bit: x > 0.
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams& p) {
    T alpha = T(p.p0), scale = T(p.p1), iscale = T(p.p2);
    const T neg = m::expm1(x * iscale) * (alpha * scale); // unconditional: vectorises
    return x <= T(0) ? neg : x * scale;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams& p) {
    T alpha = T(p.p0), scale = T(p.p1), iscale = T(p.p2);
    const T neg = iscale * (alpha * scale) * m::exp(x * iscale);
    return x <= T(0) ? neg : scale;
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return x > T(0);
  }
  // The saved output overflowed the storage dtype: x kept.
  template <typename T>
  MEMSLIM_HD static bool exact(T x, T y, const ActParams& p) {
    return p.keep_overflow & detail::saved_overflows(x, y, p);
  }
  // A NaN input takes the negative branch (NaN), as aten's vectorised CPU
  // loop does (its scalar loop and CUDA kernel return `scale`).
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool b, const ActParams& p) {
    T alpha = T(p.p0), scale = T(p.p1), iscale = T(p.p2);
    bool pos = p.bits ? b : (y > T(0));
    // On the negative branch y + alpha*scale = alpha*scale*exp(input_scale*x)
    // has alpha*scale's sign; a rounded y near -alpha*scale can flip it (fp16
    // celu at x = -inf gave -2.8e-4 for aten's 0): 0 is then the closer value.
    const T as = alpha * scale;
    T t = y + as;
    t = t * as < T(0) ? T(0) : t;
    return pos ? scale : iscale * t;
  }
};

template <>
struct ActMath<Act::LeakyRelu> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams& p) {
    return x > T(0) ? x : x * T(p.p0);
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams& p) {
    return x > T(0) ? T(1) : T(p.p0);
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return x > T(0);
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T, bool b, const ActParams& p) {
    return b ? T(1) : T(p.p0);
  }
};

template <>
struct ActMath<Act::Hardswish> {
  // Closed-form inverse: on (-3, 3) y = x(x+3)/6, so f'(x) = (2x+3)/6 =
  // +-sqrt(9 + 24y)/6. aten's backward uses x <= -3 -> 0, x < 3 -> x/3 + 0.5,
  // else 1. bit: x < -1.5 (the decreasing branch and the flat tail). With the
  // bit set, y == 0 only comes from x <= -3 (derivative 0); with it clear,
  // y >= 3 only from x >= 3 (derivative 1), and y == +-0 from x == +-0 or a
  // tiny negative x whose output underflowed (derivative 0.5, the formula's).
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return x * m::min(m::max(x + T(3), T(0)), T(6)) / T(6);
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    return x <= T(-3) ? T(0) : (x < T(3) ? x / T(3) + T(0.5) : T(1));
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return x < T(-1.5);
  }
  // Kept exactly: the guard band, and under activation_dropout (out_scale !=
  // 1) inputs near the kink at x = 3, where y = 3 switches the derivative from
  // 1.5 to 1 and y recovered as out / scale can be off by an ulp (0.05 covers
  // bf16's ulp at 3, 0.016; 0.04% of N(0,1) inputs).
  template <typename T>
  MEMSLIM_HD static bool exact(T x, T, const ActParams& p) {
    return (m::fabs(x + T(1.5)) < T(p.band)) |
           ((p.out_scale != 1.0) & (m::fabs(x - T(3)) < T(0.05)));
  }
  // y = NaN comes from x = -inf (bit set; aten: 0) or x = NaN (bit clear;
  // aten's vectorised loop: NaN, which r is then).
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool b, const ActParams&) {
    T r = m::sqrt(m::max(T(9) + T(24) * y, T(0))) / T(6);
    if (b) return (y == T(0)) | m::isnan(y) ? T(0) : -r;
    return y >= T(3) ? T(1) : r;
  }
};

template <>
struct ActMath<Act::Hardsigmoid> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return m::min(m::max(x + T(3), T(0)), T(6)) / T(6);
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    return (x > T(-3) && x < T(3)) ? T(1) / T(6) : T(0);
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return x > T(-3) && x < T(3);
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T, bool b, const ActParams&) {
    return b ? T(1) / T(6) : T(0);
  }
};

template <>
struct ActMath<Act::Sigmoid> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return T(1) / (T(1) + m::exp(-x));
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams& p) {
    T y = forward(x, p);
    return y * (T(1) - y);
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool, const ActParams&) {
    return (T(1) - y) * y;
  }
};

template <>
struct ActMath<Act::Tanh> {
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return m::tanh(x);
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    T y = m::tanh(x);
    return T(1) - y * y;
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T y, bool, const ActParams&) {
    return T(1) - y * y;
  }
};

template <>
struct ActMath<Act::Relu> {
  // NaN propagates like aten's clamp_min; the bit is "not <= 0" so a NaN input
  // passes its gradient through, as aten's threshold_backward on the result does.
  template <typename T>
  MEMSLIM_HD static T forward(T x, const ActParams&) {
    return x <= T(0) ? T(0) : x;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_input(T x, const ActParams&) {
    return x > T(0) ? T(1) : T(0);
  }
  template <typename T>
  MEMSLIM_HD static bool bit(T x, const ActParams&) {
    return !(x <= T(0));
  }
  template <typename T>
  MEMSLIM_HD static bool exact(T, T, const ActParams&) {
    return false;
  }
  template <typename T>
  MEMSLIM_HD static T grad_from_output(T, bool b, const ActParams&) {
    return b ? T(1) : T(0);
  }
};

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
