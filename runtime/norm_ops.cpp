//===- norm_ops.cpp - norms that keep their output, not their input --------===//
//
// What: memslim::layer_norm, rms_norm, group_norm and batch_norm (aten's
// signatures, rows of norm_table.def). The forward is aten's own kernel (the
// same values and running-stat updates). The Autograd kernel keeps the output
// (which the next matmul or conv keeps anyway), the per-group rstd and, for the
// channels whose affine scale cannot be inverted within the error bound (gamma
// zero or non-finite, |beta| > K |gamma|), their x_hat slice. That choice is
// made per call from gamma by memslim::norm_fallback, so zero_init_residual's
// gamma = 0 is exact. Backward rebuilds x_hat = (y - beta) / gamma, puts the
// kept slice back, and runs the norm's backward formula in opmath (fp32 for
// 16-bit) with aten ops: it runs on every device, and torch.compile traces
// and fuses it.
// Why: aten's norms keep their input, the next layer keeps their output: two
// tensors where one (plus per-group statistics) determines the gradient.
// Error bound: the rebuilt x_hat differs from (x - mean) * rstd by at most
// about u (|x_hat| + |beta / gamma|), u the unit roundoff of y's dtype; K = 64
// for fp32/fp64 (<= 4e-6 for |x_hat| <= 1) and 2 for 16-bit outputs (aten's own
// 16-bit backward reads a rounded x: the same order). aten's CPU batch and
// group norms add u(opmath) |mean| rstd (they compute y = x * scale + shift):
// channels where that exceeds K u(y) keep x_hat too (seed 700679).
// Double backward is not supported (a create_graph backward raises).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "memslim/act_recompute.h"
#include "memslim/activation_ops.h"
#include "memslim/plain_cpu.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Norm { Layer, Rms, Group, Batch };

Norm norm_from(c10::string_view s) {
  if (s == "layer_norm") return Norm::Layer;
  if (s == "rms_norm") return Norm::Rms;
  if (s == "group_norm") return Norm::Group;
  if (s == "batch_norm") return Norm::Batch;
  TORCH_CHECK(false, "memslim: unknown norm '", std::string(s), "'");
}

at::ScalarType opmath(at::ScalarType t) { return at::toOpMathType(t); }

// Optional tensor arguments (aten's `Tensor?`) to and from undefined tensors.
std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}
at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? *t : at::Tensor();
}

// The largest |beta / gamma| whose channel is rebuilt from y (see the header).
double inversion_bound(at::ScalarType y) {
  return (y == at::kHalf || y == at::kBFloat16) ? 2.0 : 64.0;
}

// The largest |mean| rstd whose channel is rebuilt from y: that term's
// rounding, u(opmath) |mean| rstd, within the bound's K u(y) (see the header).
double mean_shift_bound(at::ScalarType y, at::ScalarType om) {
  auto unit = [](at::ScalarType t) {
    return t == at::kDouble     ? 0x1p-53
           : t == at::kHalf     ? 0x1p-11
           : t == at::kBFloat16 ? 0x1p-8
                                : 0x1p-24;
  };
  return inversion_bound(y) * unit(y) / unit(om);
}

// The affine dims (the ones gamma spans) and the dims reduced to get a
// per-affine-element sum (grad gamma / beta), for y of rank `dim`.
struct Dims {
  int64_t first_affine = 0, affine_count = 0; // contiguous range of affine dims
  std::vector<int64_t> other;                 // every other dim
};
Dims dims_of(Norm k, int64_t dim, int64_t normalized_dims) {
  Dims d;
  if (k == Norm::Layer || k == Norm::Rms) {
    d.first_affine = dim - normalized_dims;
    d.affine_count = normalized_dims;
  } else {
    d.first_affine = 1;
    d.affine_count = 1;
  }
  for (int64_t i = 0; i < dim; ++i)
    if (i < d.first_affine || i >= d.first_affine + d.affine_count) d.other.push_back(i);
  return d;
}

// x viewed (or copied) as (A, C, S): C the affine elements, flattened.
at::Tensor as_acs(const at::Tensor& t, const Dims& d) {
  c10::SymInt a = 1, c = 1, s = 1;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i < d.first_affine)
      a = a * t.sym_size(i);
    else if (i < d.first_affine + d.affine_count)
      c = c * t.sym_size(i);
    else
      s = s * t.sym_size(i);
  }
  return t.reshape_symint({a, c, s});
}

// A per-affine-element tensor (gamma, beta: affine dims' shape) broadcast
// against y of rank `dim`.
at::Tensor affine_view(const at::Tensor& p, const Dims& d, int64_t dim) {
  std::vector<c10::SymInt> shape(dim, 1);
  for (int64_t i = 0; i < d.affine_count; ++i)
    shape[d.first_affine + i] = p.dim() == d.affine_count ? p.sym_size(i) : c10::SymInt(-1);
  if (p.dim() != d.affine_count) shape[d.first_affine] = p.sym_numel();
  return p.reshape_symint(shape);
}

// The statistic (mean or rstd) per element of the (A, C, S) view, broadcastable:
// (A, 1, 1) for layer/rms, (N, C, 1) for group, (1, C, 1) for batch.
at::Tensor stat_acs(const at::Tensor& st, Norm k, const c10::SymInt& a, const c10::SymInt& c,
                    int64_t groups) {
  switch (k) {
    case Norm::Layer:
    case Norm::Rms:
      return st.reshape_symint({a, 1, 1});
    case Norm::Group:
      return st.reshape_symint({a, groups, 1}).repeat_interleave_symint(c / groups, 1);
    case Norm::Batch:
      return st.reshape_symint({1, c, 1});
  }
  return st;
}

// memslim::norm_fallback on CPU / CUDA: the channels whose gamma cannot be
// inverted within the bound, and x_hat there (A, k, S) in opmath.
std::tuple<at::Tensor, at::Tensor> norm_fallback_impl(
    const at::Tensor& input, const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    c10::string_view norm, int64_t normalized_dims, int64_t groups, at::ScalarType out_dtype) {
  const Norm k = norm_from(norm);
  const auto om = opmath(input.scalar_type());
  const Dims d = dims_of(k, input.dim(), normalized_dims);
  // int32 channel indices: a zero-initialised gamma sends every channel here,
  // and int64 made the op keep more than aten (timm's tresnet_m: +26 KB).
  auto idx_opts = input.options().dtype(at::kInt);
  if (!weight || !weight->defined()) {
    // gamma = 1 everywhere: every channel inverts.
    return {at::empty({0}, idx_opts), at::empty({0}, input.options().dtype(om))};
  }
  const at::Tensor w = weight->reshape(-1).to(om);
  at::Tensor ok = w.abs().isfinite().logical_and(w.ne(0));
  if (bias && bias->defined()) {
    const at::Tensor b = bias->reshape(-1).to(om);
    ok = ok.logical_and(b.abs().le(w.abs() * inversion_bound(out_dtype)));
  }
  const at::Tensor x3 = as_acs(input, d);
  if (mean && mean->defined() && (k == Norm::Batch || k == Norm::Group)) {
    // aten's CPU kernels compute y = x * (gamma rstd) + (beta - mean gamma rstd):
    // y carries u |mean| rstd of x_hat's units on top (long-fuzz seed 700679: an
    // exactly constant channel, rstd = 1 / sqrt(eps), x_hat 0 in aten, 1e-5
    // rebuilt). Channels (any sample's group, for group norm) where that exceeds
    // the bound keep their x_hat.
    const int64_t a = x3.size(0), c = x3.size(1);
    const at::Tensor shift =
        (stat_acs(mean->to(om), k, a, c, groups).abs() * stat_acs(rstd.to(om), k, a, c, groups))
            .amax(at::IntArrayRef{0, 2});
    ok = ok.logical_and(shift.le(mean_shift_bound(out_dtype, om)));
  }
  const at::Tensor idx = at::nonzero(ok.logical_not()).reshape(-1).to(at::kInt);
  if (idx.numel() == 0) // fresh empty tensors: nonzero's result may hold storage
    return {at::empty({0}, idx_opts),
            at::empty({x3.size(0), 0, x3.size(2)}, input.options().dtype(om))};
  const int64_t a = x3.size(0), c = x3.size(1);
  at::Tensor xs = x3.index_select(1, idx).to(om);
  auto pick = [&](const at::Tensor& st) {
    at::Tensor s = stat_acs(st.to(om), k, a, c, groups);
    return s.size(1) == 1 ? s : s.index_select(1, idx);
  };
  if (mean && mean->defined()) xs = xs - pick(*mean);
  return {idx, xs * pick(rstd)};
}

using FallbackOp = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, int64_t,
    int64_t, at::ScalarType);

std::tuple<at::Tensor, at::Tensor> call_fallback(const at::Tensor& x, const at::Tensor& mean,
                                                 const at::Tensor& rstd, const at::Tensor& w,
                                                 const at::Tensor& b, const std::string& norm,
                                                 int64_t nd, int64_t groups,
                                                 at::ScalarType out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("memslim::norm_fallback", "")
                             .typed<FallbackOp>();
  return op.call(x, opt(mean), rstd, opt(w), opt(b), norm, nd, groups, out_dtype);
}

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
                                                            const at::Tensor& b,
                                                            const NormCall& c) {
  switch (norm_from(c.norm)) {
    case Norm::Layer:
      return at::native_layer_norm_symint(x, c.normalized_shape, opt(w), opt(b), c.eps);
    case Norm::Rms: {
      std::vector<int64_t> shape;
      for (const auto& s : c.normalized_shape) shape.push_back(s.guard_int(__FILE__, __LINE__));
      auto [y, rstd] = at::_fused_rms_norm(x, shape, opt(w), c.rms_eps);
      return {y, at::Tensor(), rstd};
    }
    case Norm::Group: {
      const c10::SymInt n = x.sym_size(0), ch = x.sym_size(1);
      c10::SymInt hw = 1;
      for (int64_t i = 2; i < x.dim(); ++i) hw = hw * x.sym_size(i);
      return at::native_group_norm_symint(x, opt(w), opt(b), n, ch, hw, c.groups, c.eps);
    }
    case Norm::Batch: {
      auto [y, mean, invstd] =
          at::native_batch_norm(x, opt(w), opt(b), opt(c.running_mean), opt(c.running_var),
                                c.training, c.momentum, c.eps);
      if (c.training) return {y, mean, invstd};
      // Eval: the running statistics, as they are now (a later training step
      // updates them in place).
      const auto om = opmath(x.scalar_type());
      return {y, c.running_mean.to(om), (c.running_var.to(om) + c.eps).rsqrt()};
    }
  }
  TORCH_CHECK(false, "memslim: unknown norm");
}

// Batch norm's training backward straight from y: aten's kernel computes
// (x - mean) * invstd wherever it needs x_hat, so with x = y, mean = beta and
// invstd = 1 / gamma it gets x_hat itself (gamma x_hat / gamma), and with
// weight gamma^2 rstd its input gradient carries gamma rstd as it should; its
// weight gradient, sum(g (x - mean)) invstd, is gamma's. No x_hat pass (sub +
// div: 10 ms of resnet50-GELU's step, batch 32, 1 thread). The same values up
// to rounding; a constant channel's y - beta is still 0 exactly. Only where
// every channel inverts (no kept slice) and gamma, 1 / gamma and gamma^2 rstd
// are normal numbers of the opmath type (checked here, on plain CPU data; else
// the x_hat pass runs). Returns the (mean, invstd, weight) to pass, or nothing.
template <typename T>
bool normal_factors(const T* g, const T* r, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    const T a = std::fabs(g[c]), w2 = a * a * r[c];
    if (!(a >= T(0x1p-24) && a <= T(0x1p24) && w2 >= std::numeric_limits<T>::min() &&
          w2 <= std::numeric_limits<T>::max()))
      return false;
  }
  return true;
}
std::optional<std::array<at::Tensor, 3>> batch_norm_from_y(const at::Tensor& y,
                                                           const at::Tensor& w_om,
                                                           const at::Tensor& b, const at::Tensor& r,
                                                           const at::Tensor& idx) {
  if (!w_om.defined() || !plain_cpu(y) || !plain_cpu(w_om) || !plain_cpu(r) || !plain_cpu(idx) ||
      idx.numel() != 0)
    return std::nullopt;
  const at::Tensor g = w_om.reshape(-1).contiguous(), rs = r.reshape(-1).contiguous();
  if (g.numel() != rs.numel()) return std::nullopt;
  const bool ok =
      g.scalar_type() == at::kFloat
          ? normal_factors(g.const_data_ptr<float>(), rs.const_data_ptr<float>(), g.numel())
      : g.scalar_type() == at::kDouble
          ? normal_factors(g.const_data_ptr<double>(), rs.const_data_ptr<double>(), g.numel())
          : false;
  if (!ok) return std::nullopt;
  const at::Tensor mean = b.defined() ? b.reshape(-1).to(g.scalar_type()) : at::zeros_like(g);
  return std::array<at::Tensor, 3>{mean, g.reciprocal(), g * g * rs};
}

// The norm's backward from y (see the header): grads of input, gamma, beta.
// `y` may be in opmath already (a join rebuilt it); `x_dtype` is the input's.
// The kept slices are put back where gamma is given or a join asked for them.
variable_list norm_backward(const at::Tensor& grad, const at::Tensor& y, const at::Tensor& rstd,
                            const at::Tensor& w, const at::Tensor& b, const at::Tensor& idx,
                            const at::Tensor& xh_kept, const NormCall& c, std::array<bool, 3> need,
                            at::ScalarType x_dtype, bool kept_slices, bool y_is_temp = false) {
  const Norm k = norm_from(c.norm);
  const auto om = opmath(x_dtype);
  const int64_t dim = y.dim();
  const Dims d = dims_of(k, dim, c.normalized_dims);
  // x_hat = (y - beta) / gamma, in this order: a constant input's y is beta
  // exactly, so its x_hat is 0 exactly, as aten's (y * (1 / gamma) - beta /
  // gamma, one pass less, gave 5e-7: fuzz seed 88's gamma gradient, 0 in aten).
  at::Tensor xh;
  const at::Tensor w_om = w.defined() ? w.to(om) : at::Tensor();
  const at::Tensor gy = grad.to(om);
  const at::Tensor r = rstd.to(om);
  const std::array<bool, 3> mask{need[0], need[1] && w.defined(), need[2] && b.defined()};
  if (k == Norm::Batch && c.training)
    if (auto f = batch_norm_from_y(y, w_om, b, r, idx)) {
      const auto& [mean, invstd, weight] = *f;
      auto [gx, gw, gb] = at::native_batch_norm_backward(
          gy, y.to(om), weight, std::nullopt, std::nullopt, mean, invstd, true, 0.0, mask);
      if (gx.defined()) gx = gx.to(x_dtype);
      if (gw.defined()) gw = gw.reshape_symint(w.sym_sizes()).to(w.scalar_type());
      if (gb.defined()) gb = gb.reshape_symint(b.sym_sizes()).to(b.scalar_type());
      return {gx, gw, gb};
    }
  if (b.defined()) {
    // (A join's y is a tensor of its own in opmath: rebuilt in place.)
    xh = y_is_temp && y.scalar_type() == om ? y.sub_(affine_view(b.to(om), d, dim))
                                            : y.to(om) - affine_view(b.to(om), d, dim);
    if (w.defined()) xh.div_(affine_view(w_om, d, dim));
  } else {
    xh = w.defined() ? y.to(om) / affine_view(w_om, d, dim) : y.to(om);
  }
  if (kept_slices) {
    // The kept slices of the channels gamma does not invert (possibly none),
    // written in place into a tensor of our own.
    if (xh.is_alias_of(y) && !y_is_temp) xh = xh.clone();
    at::Tensor x3 = as_acs(xh, d);
    x3.index_copy_(1, idx.to(at::kLong), xh_kept.to(om));
    if (!x3.is_alias_of(xh)) xh = x3.reshape_symint(y.sym_sizes());
  }
  // aten's own fused backward kernels, run on x_hat as their input with mean 0
  // and rstd 1 (so they normalize nothing); the input gradient is then scaled
  // by the real rstd (batch norm: folded into the weight it already scales by).
  auto opt_om = [&](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t.to(om)) : std::nullopt;
  };
  at::Tensor gx, gw, gb;
  auto sum_other = [&](const at::Tensor& t) { return d.other.empty() ? t : t.sum(d.other); };
  switch (k) {
    case Norm::Batch: {
      const at::Tensor wr = w.defined() ? w_om.reshape(-1) * r : r;
      if (c.training) {
        std::tie(gx, gw, gb) =
            at::native_batch_norm_backward(gy, xh, wr, std::nullopt, std::nullopt,
                                           at::zeros_like(r), at::ones_like(r), true, 0.0, mask);
      } else {
        if (mask[0]) gx = gy * affine_view(wr, d, dim);
        if (mask[1]) gw = sum_other(gy * xh);
        if (mask[2]) gb = sum_other(gy);
      }
      break;
    }
    case Norm::Layer: {
      std::vector<c10::SymInt> shape(y.sym_sizes().begin() + d.first_affine, y.sym_sizes().end());
      std::tie(gx, gw, gb) = at::native_layer_norm_backward_symint(
          gy, xh, shape, at::zeros_like(r), at::ones_like(r), opt_om(w), opt_om(b), mask);
      if (gx.defined()) gx = gx * r;
      break;
    }
    case Norm::Rms: {
      if (y.is_cuda()) { // aten's fused kernel exists on CUDA only
        std::vector<int64_t> shape;
        for (int64_t i = d.first_affine; i < dim; ++i)
          shape.push_back(y.sym_size(i).guard_int(__FILE__, __LINE__));
        std::tie(gx, gw) = at::_fused_rms_norm_backward(gy, xh, shape, at::ones_like(r), opt_om(w),
                                                        {mask[0], mask[1]});
      } else {
        std::vector<int64_t> red;
        for (int64_t i = d.first_affine; i < dim; ++i) red.push_back(i);
        const at::Tensor g = w.defined() ? gy * affine_view(w_om, d, dim) : gy;
        if (mask[0]) gx = g - xh * (g * xh).mean(red, /*keepdim=*/true);
        if (mask[1]) gw = sum_other(gy * xh);
      }
      if (gx.defined()) gx = gx * r;
      break;
    }
    case Norm::Group: {
      const c10::SymInt n = y.sym_size(0), ch = y.sym_size(1);
      c10::SymInt hw = 1;
      for (int64_t i = 2; i < dim; ++i) hw = hw * y.sym_size(i);
      std::tie(gx, gw, gb) = at::native_group_norm_backward_symint(
          gy, xh, at::zeros_like(r), at::ones_like(r), opt_om(w), n, ch, hw, c.groups, mask);
      if (gx.defined())
        gx = (gx.reshape_symint({n, c.groups, -1}) * r.reshape_symint({n, c.groups, 1}))
                 .reshape_symint(y.sym_sizes());
      break;
    }
  }
  if (gx.defined()) gx = gx.to(x_dtype);
  if (gw.defined()) gw = gw.reshape_symint(w.sym_sizes()).to(w.scalar_type());
  if (gb.defined()) gb = gb.reshape_symint(b.sym_sizes()).to(b.scalar_type());
  return {gx, gw, gb};
}

struct NormFunction : public torch::autograd::Function<NormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_arg,
                               const at::Tensor& b_arg, const NormCall& c) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor w = c.has_weight ? w_arg : at::Tensor();
    const at::Tensor b = c.has_bias ? b_arg : at::Tensor();
    auto [y, mean, rstd] = aten_forward(x, w, b, c);
    auto [idx, xh] =
        call_fallback(x, mean, rstd, w, b, c.norm, c.normalized_dims, c.groups, y.scalar_type());
    ctx->save_for_backward({y, rstd, w, b, idx, xh});
    ctx->saved_data["norm"] = c.norm;
    ctx->saved_data["nd"] = c.normalized_dims;
    ctx->saved_data["groups"] = c.groups;
    ctx->saved_data["training"] = c.training;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::string norm = ctx->saved_data["norm"].toStringRef();
    TORCH_CHECK(!at::GradMode::is_enabled(), "memslim::", norm,
                ": double backward is not supported (the backward keeps only the output and "
                "statistics); use the aten op where higher-order gradients are needed");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto s = ctx->get_saved_variables();
    NormCall c;
    c.norm = norm;
    c.normalized_dims = ctx->saved_data["nd"].toInt();
    c.groups = ctx->saved_data["groups"].toInt();
    c.training = ctx->saved_data["training"].toBool();
    auto g = norm_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], s[5], c,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)},
        s[0].scalar_type(), s[2].defined());
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

// The residual joins: out = norm(x) + act(residual) ("none": residual itself).
// Keeps out and residual (each kept by the next layer or the previous one in
// a ResNet) instead of x: backward rebuilds y = out - act(residual), then
// x_hat from y. Rounding out adds about u (|y| + |act(residual)|) to y, so a
// channel also falls back when max |act(residual)| there exceeds K |gamma|:
// norm_fallback is asked with |beta| + that maximum as its beta.
struct JoinCall {
  std::string act;
  std::vector<double> params;
};

// The join's sum on contiguous CPU float / double tensors of one shape: one
// pass of the kernels library (AVX2 where the processor has it) instead of
// aten's add and per-channel abs + amax in the forward. With a ReLU the pass
// computes relu itself (and the backward's y = out - relu(r) is one pass too):
// profiled, 43 ms of resnet50's 103 ms over eager (batch 32, 1 thread); with
// another activation aten computes act(r) first and the pass adds it (abs +
// amax: 18 ms of resnet50-GELU's step). The values are aten's bit for bit: relu
// is clamp_min(v, 0) value for value, the sum the same single IEEE add, the
// maximum of |v| exact. (plain_cpu.h: a dense CPU tensor with real data.)
bool join_fusable(const at::Tensor& y, const at::Tensor& r) {
  return plain_cpu(y) && plain_cpu(r) &&
         (y.scalar_type() == at::kFloat || y.scalar_type() == at::kDouble) &&
         r.scalar_type() == y.scalar_type() && y.sizes() == r.sizes() && y.is_contiguous() &&
         r.is_contiguous() && y.numel() > 0;
}
bool relu_join_fusable(const at::Tensor& y, const at::Tensor& r, const std::string& act) {
  return act == "relu" && join_fusable(y, r);
}

// y += relu(r) (or y += r: `relu` false) in place; returns max |relu(r)| (|r|)
// per C of the (A, C, S) view.
at::Tensor fused_join_forward(at::Tensor& y, const at::Tensor& r, bool relu, int64_t A, int64_t C,
                              int64_t S) {
  const int nt = at::get_num_threads();
  at::Tensor part = at::full({nt, C}, -std::numeric_limits<double>::infinity(), y.options());
  const auto t = to_kernel_dtype(y.scalar_type());
  void* yp = y.data_ptr();
  const void* rp = r.const_data_ptr();
  char* pp = static_cast<char*>(part.data_ptr());
  const int64_t row_bytes = C * static_cast<int64_t>(y.element_size());
  at::parallel_for(0, A * C, std::max<int64_t>(1, 32768 / S), [&](int64_t b, int64_t e) {
    void* cmax = pp + at::get_thread_num() * row_bytes;
    if (relu)
      kernels::relu_join_forward_cpu(t, yp, rp, cmax, C, S, b, e);
    else
      kernels::add_join_forward_cpu(t, yp, rp, cmax, C, S, b, e);
  });
  return nt == 1 ? part[0] : part.amax(0);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> join_forward(
    const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& residual,
    const NormCall& c, const JoinCall& j, bool save) {
  auto [y, mean, rstd] = aten_forward(x, w, b, c);
  const Dims d = dims_of(norm_from(c.norm), y.dim(), c.normalized_dims);
  const auto om = opmath(x.scalar_type());
  // (Converted only where the dtype differs: `to` returning its input is an
  // alias the schema checks of opcheck refuse below autograd.)
  auto in_om = [&](const at::Tensor& t) { return t.scalar_type() == om ? t : t.to(om); };
  at::Tensor out, amax; // the sum; max |act(residual)| per channel (when saving)
  int64_t A = 1, C = 1, S = 1;
  for (int64_t i = 0; i < y.dim(); ++i)
    (i < d.first_affine ? A : i < d.first_affine + d.affine_count ? C : S) *= y.size(i);
  // (y is aten's fresh output unless the norm returned an alias.)
  const bool y_own = !y.is_alias_of(x) && !y.is_alias_of(residual);
  if (relu_join_fusable(y, residual, j.act) && y_own) {
    amax = in_om(fused_join_forward(y, residual, /*relu=*/true, A, C, S));
    out = y;
  } else {
    at::Tensor a = act_recompute(residual, j.act, j.params);
    if (save && j.act != "relu" && y_own && join_fusable(y, a)) {
      amax = in_om(fused_join_forward(y, a, /*relu=*/false, A, C, S));
      out = y;
    } else {
      // act(residual) is a fresh tensor of our own unless act is "none": the sum is
      // written into it (y + a and a + y are the same IEEE sum).
      const bool a_fresh = j.act != "none" && a.scalar_type() == y.scalar_type() &&
                           a.sizes() == y.sizes() && !a.is_alias_of(residual);
      // relu's output is >= 0 (or NaN, which amax keeps): no abs pass.
      if (save) {
        const at::Tensor a3 = as_acs(a, d);
        amax = in_om((j.act == "relu" ? a3 : a3.abs()).amax(at::IntArrayRef{0, 2}));
      }
      out = a_fresh ? a.add_(y) : at::add(y, a);
    }
  }
  if (!save) return {out, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  const at::Tensor weff = w.defined() ? w.reshape(-1) : at::ones_like(amax);
  const at::Tensor beff = b.defined() ? in_om(b.reshape(-1)).abs() + amax : amax;
  auto [idx, xh] = call_fallback(x, mean, rstd, weff, beff, c.norm, c.normalized_dims, c.groups,
                                 y.scalar_type());
  return {out, rstd, idx, xh, at::Tensor()};
}

struct NormJoinFunction : public torch::autograd::Function<NormJoinFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_arg,
                               const at::Tensor& b_arg, const at::Tensor& residual,
                               const NormCall& c, const JoinCall& j) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor w = c.has_weight ? w_arg : at::Tensor();
    const at::Tensor b = c.has_bias ? b_arg : at::Tensor();
    auto [out, rstd, idx, xh, unused] = join_forward(x, w, b, residual, c, j, /*save=*/true);
    ctx->save_for_backward({out, residual, rstd, w, b, idx, xh});
    ctx->saved_data["norm"] = c.norm;
    ctx->saved_data["nd"] = c.normalized_dims;
    ctx->saved_data["groups"] = c.groups;
    ctx->saved_data["training"] = c.training;
    ctx->saved_data["act"] = j.act;
    ctx->saved_data["params"] = j.params;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::string norm = ctx->saved_data["norm"].toStringRef();
    TORCH_CHECK(!at::GradMode::is_enabled(), "memslim::", norm,
                "_add: double backward is not supported (the backward keeps only the output, "
                "the residual and statistics); use the aten ops where higher-order gradients "
                "are needed");
    const variable_list none(4 + 2);
    if (!grads[0].defined()) return none;
    auto s = ctx->get_saved_variables();
    const at::Tensor &out = s[0], &residual = s[1];
    NormCall c;
    c.norm = norm;
    c.normalized_dims = ctx->saved_data["nd"].toInt();
    c.groups = ctx->saved_data["groups"].toInt();
    c.training = ctx->saved_data["training"].toBool();
    const std::string act = ctx->saved_data["act"].toStringRef();
    const std::vector<double> params = ctx->saved_data["params"].toDoubleVector();
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const auto om = opmath(x_dtype);
    const bool fused = relu_join_fusable(out, residual, act) && out.scalar_type() == om;
    // The forward's values. Fused (relu): the residual stands in for relu(residual)
    // in its backward, threshold_backward(g, v, 0): v > 0 exactly where relu(v) > 0.
    // Else act(residual), with its derivative in the same pass where the
    // residual's gradient is wanted and there is one (gelu).
    at::Tensor a, da;
    if (fused)
      a = residual;
    else if (auto ad = ctx->needs_input_grad(3) ? act_with_derivative(residual, act) : std::nullopt)
      std::tie(a, da) = *ad;
    else
      a = act_recompute(residual, act, params);
    at::Tensor y; // a tensor of our own: rebuilt in place
    if (fused) {
      y = at::empty_like(out);
      const auto t = to_kernel_dtype(out.scalar_type());
      void* yp = y.data_ptr();
      const void *op = out.const_data_ptr(), *rp = residual.const_data_ptr();
      at::parallel_for(0, out.numel(), 32768, [&](int64_t b, int64_t e) {
        kernels::relu_join_rebuild_cpu(t, yp, op, rp, b, e);
      });
    } else {
      y = out.to(om) - a.to(om);
    }
    variable_list r = none;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      auto g = norm_backward(
          grads[0], y, s[2], s[3], s[4], s[5], s[6], c,
          {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)}, x_dtype,
          /*kept_slices=*/true, /*y_is_temp=*/true);
      r[0] = g[0], r[1] = g[1], r[2] = g[2];
    }
    if (ctx->needs_input_grad(3))
      r[3] = (da.defined() ? da.mul_(grads[0])
                           : act_recompute_backward(grads[0], residual, a, act, params))
                 .to(residual.scalar_type());
    return r;
  }
};

// The Autograd kernel body: the saving path when anything requires grad, else
// aten's forward (called as aten ops, so functionalization sees aten's
// declared running-stat writes).
at::Tensor norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const NormCall& c) {
  const at::Tensor w = defined_or_empty(weight), b = defined_or_empty(bias);
  const bool grad =
      at::GradMode::is_enabled() && (x.requires_grad() || (w.defined() && w.requires_grad()) ||
                                     (b.defined() && b.requires_grad()));
  if (grad) {
    NormCall call = c;
    call.has_weight = w.defined();
    call.has_bias = b.defined();
    const at::Tensor absent = at::empty({0}, x.options());
    return NormFunction::apply(x, w.defined() ? w : absent, b.defined() ? b : absent, call)[0];
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(aten_forward(x, w, b, c));
}

// The public ops' kernels, one pair (plain, autograd) per norm.
NormCall layer_call(c10::SymIntArrayRef shape, double eps) {
  NormCall c;
  c.norm = "layer_norm";
  c.normalized_shape.assign(shape.begin(), shape.end());
  c.normalized_dims = static_cast<int64_t>(shape.size());
  c.eps = eps;
  return c;
}
NormCall rms_call(c10::SymIntArrayRef shape, std::optional<double> eps) {
  NormCall c = layer_call(shape, 0);
  c.norm = "rms_norm";
  c.rms_eps = eps;
  return c;
}
NormCall group_call(int64_t groups, double eps) {
  NormCall c;
  c.norm = "group_norm";
  c.groups = groups;
  c.eps = eps;
  return c;
}
NormCall batch_call(const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv,
                    bool training, double momentum, double eps) {
  NormCall c;
  c.norm = "batch_norm";
  c.running_mean = defined_or_empty(rm);
  c.running_var = defined_or_empty(rv);
  c.training = training;
  c.momentum = momentum;
  c.eps = eps;
  return c;
}

at::Tensor layer_norm_autograd(const at::Tensor& x, c10::SymIntArrayRef shape,
                               const std::optional<at::Tensor>& w,
                               const std::optional<at::Tensor>& b, double eps, bool) {
  return norm_autograd(x, w, b, layer_call(shape, eps));
}
at::Tensor layer_norm_plain(const at::Tensor& x, c10::SymIntArrayRef shape,
                            const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
                            double eps, bool) {
  return std::get<0>(
      aten_forward(x, defined_or_empty(w), defined_or_empty(b), layer_call(shape, eps)));
}
at::Tensor rms_norm_autograd(const at::Tensor& x, c10::SymIntArrayRef shape,
                             const std::optional<at::Tensor>& w, std::optional<double> eps) {
  return norm_autograd(x, w, std::nullopt, rms_call(shape, eps));
}
at::Tensor rms_norm_plain(const at::Tensor& x, c10::SymIntArrayRef shape,
                          const std::optional<at::Tensor>& w, std::optional<double> eps) {
  return std::get<0>(aten_forward(x, defined_or_empty(w), at::Tensor(), rms_call(shape, eps)));
}
at::Tensor group_norm_autograd(const at::Tensor& x, int64_t groups,
                               const std::optional<at::Tensor>& w,
                               const std::optional<at::Tensor>& b, double eps, bool) {
  return norm_autograd(x, w, b, group_call(groups, eps));
}
at::Tensor group_norm_plain(const at::Tensor& x, int64_t groups, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, double eps, bool) {
  return std::get<0>(
      aten_forward(x, defined_or_empty(w), defined_or_empty(b), group_call(groups, eps)));
}
at::Tensor batch_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& w,
                               const std::optional<at::Tensor>& b,
                               const std::optional<at::Tensor>& rm,
                               const std::optional<at::Tensor>& rv, bool training, double momentum,
                               double eps, bool) {
  return norm_autograd(x, w, b, batch_call(rm, rv, training, momentum, eps));
}
at::Tensor batch_norm_plain(const at::Tensor& x, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& rm,
                            const std::optional<at::Tensor>& rv, bool training, double momentum,
                            double eps, bool) {
  return std::get<0>(aten_forward(x, defined_or_empty(w), defined_or_empty(b),
                                  batch_call(rm, rv, training, momentum, eps)));
}

// The join kernels' body: the saving path when anything requires grad.
at::Tensor join_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const at::Tensor& residual,
                         const NormCall& c, c10::string_view act, at::ArrayRef<double> params) {
  const at::Tensor w = defined_or_empty(weight), b = defined_or_empty(bias);
  JoinCall j{std::string(act), std::vector<double>(params.begin(), params.end())};
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || residual.requires_grad() ||
                     (w.defined() && w.requires_grad()) || (b.defined() && b.requires_grad()));
  if (grad) {
    NormCall call = c;
    call.has_weight = w.defined();
    call.has_bias = b.defined();
    const at::Tensor absent = at::empty({0}, x.options());
    return NormJoinFunction::apply(x, w.defined() ? w : absent, b.defined() ? b : absent, residual,
                                   call, j)[0];
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(join_forward(x, w, b, residual, c, j, /*save=*/false));
}
at::Tensor join_plain(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const at::Tensor& residual,
                      const NormCall& c, c10::string_view act, at::ArrayRef<double> params) {
  JoinCall j{std::string(act), std::vector<double>(params.begin(), params.end())};
  return std::get<0>(join_forward(x, defined_or_empty(weight), defined_or_empty(bias), residual, c,
                                  j, /*save=*/false));
}

#define MEMSLIM_JOIN_ARGS \
  const at::Tensor &residual, c10::string_view act, at::ArrayRef<double> params,
at::Tensor layer_norm_add_autograd(MEMSLIM_JOIN_ARGS const at::Tensor& x, c10::SymIntArrayRef shape,
                                   const std::optional<at::Tensor>& w,
                                   const std::optional<at::Tensor>& b, double eps, bool) {
  return join_autograd(x, w, b, residual, layer_call(shape, eps), act, params);
}
at::Tensor layer_norm_add_plain(MEMSLIM_JOIN_ARGS const at::Tensor& x, c10::SymIntArrayRef shape,
                                const std::optional<at::Tensor>& w,
                                const std::optional<at::Tensor>& b, double eps, bool) {
  return join_plain(x, w, b, residual, layer_call(shape, eps), act, params);
}
at::Tensor rms_norm_add_autograd(MEMSLIM_JOIN_ARGS const at::Tensor& x, c10::SymIntArrayRef shape,
                                 const std::optional<at::Tensor>& w, std::optional<double> eps) {
  return join_autograd(x, w, std::nullopt, residual, rms_call(shape, eps), act, params);
}
at::Tensor rms_norm_add_plain(MEMSLIM_JOIN_ARGS const at::Tensor& x, c10::SymIntArrayRef shape,
                              const std::optional<at::Tensor>& w, std::optional<double> eps) {
  return join_plain(x, w, std::nullopt, residual, rms_call(shape, eps), act, params);
}
at::Tensor group_norm_add_autograd(MEMSLIM_JOIN_ARGS const at::Tensor& x, int64_t groups,
                                   const std::optional<at::Tensor>& w,
                                   const std::optional<at::Tensor>& b, double eps, bool) {
  return join_autograd(x, w, b, residual, group_call(groups, eps), act, params);
}
at::Tensor group_norm_add_plain(MEMSLIM_JOIN_ARGS const at::Tensor& x, int64_t groups,
                                const std::optional<at::Tensor>& w,
                                const std::optional<at::Tensor>& b, double eps, bool) {
  return join_plain(x, w, b, residual, group_call(groups, eps), act, params);
}
at::Tensor batch_norm_add_autograd(MEMSLIM_JOIN_ARGS const at::Tensor& x,
                                   const std::optional<at::Tensor>& w,
                                   const std::optional<at::Tensor>& b,
                                   const std::optional<at::Tensor>& rm,
                                   const std::optional<at::Tensor>& rv, bool training,
                                   double momentum, double eps, bool) {
  return join_autograd(x, w, b, residual, batch_call(rm, rv, training, momentum, eps), act, params);
}
at::Tensor batch_norm_add_plain(MEMSLIM_JOIN_ARGS const at::Tensor& x,
                                const std::optional<at::Tensor>& w,
                                const std::optional<at::Tensor>& b,
                                const std::optional<at::Tensor>& rm,
                                const std::optional<at::Tensor>& rv, bool training, double momentum,
                                double eps, bool) {
  return join_plain(x, w, b, residual, batch_call(rm, rv, training, momentum, eps), act, params);
}
#undef MEMSLIM_JOIN_ARGS

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
#define MEMSLIM_NORM(NAME, ...)             \
  m.impl(#NAME, TORCH_FN(NAME##_autograd)); \
  m.impl(#NAME "_add", TORCH_FN(NAME##_add_autograd));
#include "memslim/kernels/norm_table.def"
}

// The plain forward is aten's on every backend (Meta included).
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
#define MEMSLIM_NORM(NAME, ...)          \
  m.impl(#NAME, TORCH_FN(NAME##_plain)); \
  m.impl(#NAME "_add", TORCH_FN(NAME##_add_plain));
#include "memslim/kernels/norm_table.def"
}

// norm_fallback has a data-dependent length: CPU and CUDA only; its fake impl
// (python/memslim/_library.py) gives the length an unbacked size.
TORCH_LIBRARY_IMPL(memslim, CPU, m) { m.impl("norm_fallback", TORCH_FN(norm_fallback_impl)); }
#ifdef MEMSLIM_WITH_CUDA
TORCH_LIBRARY_IMPL(memslim, CUDA, m) { m.impl("norm_fallback", TORCH_FN(norm_fallback_impl)); }
#endif

} // namespace memslim
