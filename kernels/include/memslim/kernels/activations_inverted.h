//===- activations_inverted.h - gelu, gelu(tanh), silu, mish ------------===//
//
// What: ActMath for the non-monotonic activations whose derivative comes from the saved
// output by inversion: the branch bit, the guard band and the formulas aten uses.
// Why: one family of activations.h's per-activation definitions (included through it).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/activations_inversion.h"
#include "memslim/kernels/activations_params.h"
#include "memslim/kernels/hd.h"

namespace memslim {
namespace kernels {

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

} // namespace kernels
} // namespace memslim
