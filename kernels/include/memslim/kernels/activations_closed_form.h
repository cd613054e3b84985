//===- activations_closed_form.h - activations with f' in closed form ---===//
//
// What: ActMath for softplus, elu, leaky_relu, hardswish, hardsigmoid, sigmoid, tanh and
// relu: the forward, aten's derivative from the input, and f' from the saved output (or
// bit) by a closed formula, no inversion.
// Why: one family of activations.h's per-activation definitions (included through it).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/activations_inversion.h"
#include "memslim/kernels/activations_params.h"
#include "memslim/kernels/hd.h"

namespace memslim {
namespace kernels {

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

} // namespace kernels
} // namespace memslim
