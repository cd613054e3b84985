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
// aten's forward, norm_fallback and the backward from y: norm_rebuild.cpp.
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
#include "memslim/norm_rebuild.h"
#include "memslim/plain_cpu.h"

namespace memslim {
namespace {

using norm::aten_forward;
using norm::call_fallback;
using norm::defined_or_empty;
using norm::Dims;
using norm::NormCall;
using norm::opmath;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
    auto g = norm::norm_backward(
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
  const Dims d = norm::dims_of(norm::norm_from(c.norm), y.dim(), c.normalized_dims);
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
        const at::Tensor a3 = norm::as_acs(a, d);
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
      auto g = norm::norm_backward(
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

} // namespace memslim
