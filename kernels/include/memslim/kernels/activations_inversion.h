//===- activations_inversion.h - f' from a saved output by inversion ----===//
//
// What: the inversion machinery of the activations with a minimum (gelu, gelu(tanh),
// silu, mish): accurate f / f' / f'', minima, first guesses from the generated fits,
// safeguarded Newton (on f and on its square-root form), the fp32 derivative tables
// (derivative_from_table) and derivative_by_inversion (activations.h says how and why).
// Why: the bulk of activations.h, apart from the per-activation formulas that call it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/activations_params.h"
#include "memslim/kernels/derivative_tables.h"
#include "memslim/kernels/hd.h"
#include "memslim/kernels/inverse_fits.h"

namespace memslim {
namespace kernels {

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

} // namespace kernels
} // namespace memslim
