//===- norm_rebuild.cpp - the norms' forward and their backward from y ----===//
//
// What: aten's forward of each norm, memslim::norm_fallback (its CPU / CUDA kernel: the
// channels whose gamma cannot be inverted within the error bound, and x_hat there), and
// norm_backward: x_hat rebuilt from the output (batch norm in training straight from y),
// the kept slices put back, aten's fused backward kernels run on it.
// Why: the numerical half of norm_ops.cpp (whose header gives the error bound), shared
// by the norms and their residual joins.
//
//===----------------------------------------------------------------------===//
#include "memslim/norm_rebuild.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "memslim/plain_cpu.h"

namespace memslim {
namespace norm {

using torch::autograd::variable_list;

namespace {

// The largest |beta / gamma| whose channel is rebuilt from y (norm_ops.cpp's header).
double inversion_bound(at::ScalarType y) {
  return (y == at::kHalf || y == at::kBFloat16) ? 2.0 : 64.0;
}

// The largest |mean| rstd whose channel is rebuilt from y: that term's
// rounding, u(opmath) |mean| rstd, within the bound's K u(y) (norm_ops.cpp's header).
double mean_shift_bound(at::ScalarType y, at::ScalarType om) {
  auto unit = [](at::ScalarType t) {
    return t == at::kDouble     ? 0x1p-53
           : t == at::kHalf     ? 0x1p-11
           : t == at::kBFloat16 ? 0x1p-8
                                : 0x1p-24;
  };
  return inversion_bound(y) * unit(y) / unit(om);
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

} // namespace

Norm norm_from(c10::string_view s) {
  if (s == "layer_norm") return Norm::Layer;
  if (s == "rms_norm") return Norm::Rms;
  if (s == "group_norm") return Norm::Group;
  if (s == "batch_norm") return Norm::Batch;
  TORCH_CHECK(false, "memslim: unknown norm '", std::string(s), "'");
}

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

// The norm's backward from y (norm_ops.cpp's header): grads of input, gamma, beta.
// `y` may be in opmath already (a join rebuilt it); `x_dtype` is the input's.
// The kept slices are put back where gamma is given or a join asked for them.
variable_list norm_backward(const at::Tensor& grad, const at::Tensor& y, const at::Tensor& rstd,
                            const at::Tensor& w, const at::Tensor& b, const at::Tensor& idx,
                            const at::Tensor& xh_kept, const NormCall& c, std::array<bool, 3> need,
                            at::ScalarType x_dtype, bool kept_slices, bool y_is_temp) {
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

} // namespace norm

// norm_fallback has a data-dependent length: CPU and CUDA only; its fake impl
// (python/memslim/_library.py) gives the length an unbacked size.
TORCH_LIBRARY_IMPL(memslim, CPU, m) { m.impl("norm_fallback", TORCH_FN(norm::norm_fallback_impl)); }
#ifdef MEMSLIM_WITH_CUDA
TORCH_LIBRARY_IMPL(memslim, CUDA, m) {
  m.impl("norm_fallback", TORCH_FN(norm::norm_fallback_impl));
}
#endif

} // namespace memslim