//===- norm_rebuild.h - the norms' forward and their backward from y ------===//
//
// What: which norm a call is (Norm, NormCall), aten's forward, the norm_fallback call (the
// channels gamma cannot invert and their x_hat), and norm_backward, which rebuilds x_hat
// from the output and runs the norm's backward formula with aten ops.
// Why: the output-saving norms and their residual joins (norm_ops.cpp) share them;
// norm_rebuild.cpp defines them (norm_ops.cpp's header says how x_hat stays exact).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/autograd.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace memslim {
namespace norm {

enum class Norm { Layer, Rms, Group, Batch };

Norm norm_from(c10::string_view s);

inline at::ScalarType opmath(at::ScalarType t) { return at::toOpMathType(t); }

// Optional tensor arguments (aten's `Tensor?`) to and from undefined tensors.
inline std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}
inline at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? *t : at::Tensor();
}

// The affine dims (the ones gamma spans) and the dims reduced to get a
// per-affine-element sum (grad gamma / beta), for y of rank `dim`.
struct Dims {
  int64_t first_affine = 0, affine_count = 0; // contiguous range of affine dims
  std::vector<int64_t> other;                 // every other dim
};
Dims dims_of(Norm k, int64_t dim, int64_t normalized_dims);

// x viewed (or copied) as (A, C, S): C the affine elements, flattened.
at::Tensor as_acs(const at::Tensor& t, const Dims& d);

// What one forward needs to run and its backward to rebuild.
struct NormCall {
  std::string norm;
  int64_t normalized_dims = 1; // layer / rms: how many trailing dims
  std::vector<c10::SymInt> normalized_shape;
  int64_t groups = 1;
  double eps = 1e-5;
  std::optional<double> rms_eps;
  bool training = true;
  double momentum = 0.1;
  at::Tensor running_mean, running_var;
  // Whether gamma / beta were given: torch::autograd::Function cannot take an
  // undefined tensor argument, so an absent one travels as an empty tensor.
  bool has_weight = true, has_bias = true;
};

// aten's forward: (y, mean or undefined, rstd), running stats updated in training.
std::tuple<at::Tensor, at::Tensor, at::Tensor> aten_forward(const at::Tensor& x,
                                                            const at::Tensor& w,
                                                            const at::Tensor& b, const NormCall& c);

// memslim::norm_fallback through the dispatcher: (channel indices, their x_hat).
std::tuple<at::Tensor, at::Tensor> call_fallback(const at::Tensor& x, const at::Tensor& mean,
                                                 const at::Tensor& rstd, const at::Tensor& w,
                                                 const at::Tensor& b, const std::string& norm,
                                                 int64_t nd, int64_t groups,
                                                 at::ScalarType out_dtype);

// The norm's backward from y (norm_ops.cpp's header): grads of input, gamma, beta.
// `y` may be in opmath already (a join rebuilt it); `x_dtype` is the input's.
// The kept slices are put back where gamma is given or a join asked for them.
torch::autograd::variable_list norm_backward(const at::Tensor& grad, const at::Tensor& y,
                                             const at::Tensor& rstd, const at::Tensor& w,
                                             const at::Tensor& b, const at::Tensor& idx,
                                             const at::Tensor& xh_kept, const NormCall& c,
                                             std::array<bool, 3> need, at::ScalarType x_dtype,
                                             bool kept_slices, bool y_is_temp = false);

} // namespace norm
} // namespace memslim
