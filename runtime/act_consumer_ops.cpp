//===- act_consumer_ops.cpp - linear / conv of act(h) that keep h ----------===//
//
// What: memslim::act_linear, act_conv1d/2d/3d (rows of consumer_table.def):
// aten's op applied to act(h), where act is a kernel activation of
// activation_table.def (`act`, `params` as activation_forward takes them).
// The Autograd kernel keeps h and the weight instead of act(h): backward
// recomputes act(h) (one pointwise pass), runs aten's linear / convolution
// backward on it, and multiplies the input gradient by act'(h) with aten's
// own activation backward. Values and gradients are aten's exactly: the same
// ops on the same values, act(h) recomputed bit for bit.
// Why: the consumer keeps its input for the weight gradient; keeping h instead
// makes act(h) a temporary. h is often kept anyway (by aten's activation,
// which keeps its input, or by an output-saving norm that made h), so
// conv -> norm -> act -> conv keeps one tensor, for every activation, ReLU
// included, and without inverting anything.
// Double backward is not supported (a create_graph backward raises).
// Dtypes: act(h) is computed in h's dtype and cast to the weight's where they
// differ, as autocast casts a linear / conv's input: the op's Autocast kernels
// (autocast_ops.cpp) pass h as the model made it and autocast's copies of the
// weight and bias, so a bf16 step keeps h and recomputes act(h)'s bf16 copy.
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <atomic>
#include <string>

#include "memslim/act_recompute.h"
#include "memslim/activation_ops.h"
#include "memslim/plain_cpu.h"

namespace memslim {
namespace {
double param(at::ArrayRef<double> p, size_t i, double fallback) {
  return i < p.size() ? p[i] : fallback;
}

} // namespace

// act(h) with aten's own op (`act`: a kernel activation name).
at::Tensor act_recompute(const at::Tensor& h, const std::string& act, at::ArrayRef<double> p) {
  if (act == "none") return h;
  if (act == "gelu") return at::gelu(h, "none");
  if (act == "gelu_tanh") return at::gelu(h, "tanh");
  if (act == "silu") return at::silu(h);
  if (act == "mish") return at::mish(h);
  if (act == "hardswish") return at::hardswish(h);
  if (act == "hardsigmoid") return at::hardsigmoid(h);
  if (act == "sigmoid") return at::sigmoid(h);
  if (act == "tanh") return at::tanh(h);
  if (act == "relu") return at::relu(h);
  if (act == "leaky_relu") return at::leaky_relu(h, param(p, 0, 0.01));
  if (act == "softplus") return at::softplus(h, param(p, 0, 1), param(p, 1, 20));
  if (act == "elu") return at::elu(h, param(p, 0, 1), param(p, 1, 1), param(p, 2, 1));
  TORCH_CHECK(false, "memslim: unknown activation '", act, "'");
}

// dL/dh from dL/d act(h), with aten's activation backward.
at::Tensor act_recompute_backward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& a,
                                  const std::string& act, at::ArrayRef<double> p) {
  if (act == "none") return g;
  if (act == "gelu") return at::gelu_backward(g, h, "none");
  if (act == "gelu_tanh") return at::gelu_backward(g, h, "tanh");
  if (act == "silu") return at::silu_backward(g, h);
  if (act == "mish") return at::mish_backward(g, h);
  if (act == "hardswish") return at::hardswish_backward(g, h);
  if (act == "hardsigmoid") return at::hardsigmoid_backward(g, h);
  if (act == "sigmoid") return at::sigmoid_backward(g, a);
  if (act == "tanh") return at::tanh_backward(g, a);
  if (act == "relu") return at::threshold_backward(g, a, 0);
  if (act == "leaky_relu") return at::leaky_relu_backward(g, h, param(p, 0, 0.01), false);
  if (act == "softplus") return at::softplus_backward(g, h, param(p, 0, 1), param(p, 1, 20));
  if (act == "elu")
    return at::elu_backward(g, param(p, 0, 1), param(p, 1, 1), param(p, 2, 1), false, h);
  TORCH_CHECK(false, "memslim: unknown activation '", act, "'");
}

std::optional<std::pair<at::Tensor, at::Tensor>> act_with_derivative(const at::Tensor& h,
                                                                     const std::string& act) {
  // fp32 only, on a vector build of the loops: there one pass (~0.5 ns per
  // element) beats aten's gelu + gelu_backward (~1.3); the scalar build (~12)
  // and fp64 (libm's erf per element) do not, and keep aten's ops.
  if (act != "gelu" || h.scalar_type() != at::kFloat || !kernels::cpu_loops_vectorised() ||
      !plain_cpu(h) || h.numel() == 0 || !h.is_non_overlapping_and_dense())
    return std::nullopt;
  // empty_like keeps h's strides: the three tensors are walked in memory order.
  at::Tensor a = at::empty_like(h), d = at::empty_like(h);
  const auto t = to_kernel_dtype(h.scalar_type());
  const void* hp = h.const_data_ptr();
  void *ap = a.data_ptr(), *dp = d.data_ptr();
  std::atomic<bool> edge{false};
  at::parallel_for(0, h.numel(), 16384, [&](int64_t b, int64_t e) {
    if (kernels::gelu_value_derivative_cpu(t, hp, ap, dp, b, e)) edge = true;
  });
  // Non-finite or huge inputs: act(h) from aten, as the forward computed it
  // (aten's vectorised gelu gives NaN at +inf and overflows near FLT_MAX).
  if (edge) a = act_recompute(h, act, {});
  return std::make_pair(a, d);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One call's non-tensor arguments.
struct ConsumerCall {
  int64_t spatial = 0; // 0: linear
  std::vector<c10::SymInt> stride, padding, dilation;
  c10::SymInt groups = 1;
  std::string act;
  std::vector<double> params;
  bool has_bias = true; // an absent bias travels as an empty tensor (see norm_ops.cpp)
};

// act(h) as the consumer reads it: cast to the weight's dtype where it differs
// (autocast's cast of a linear / conv input; h stays as the model made it).
at::Tensor consumer_input(const at::Tensor& a, const at::Tensor& w) {
  return a.scalar_type() == w.scalar_type() ? a : a.to(w.scalar_type());
}

at::Tensor consumer_forward(const at::Tensor& act_h, const at::Tensor& w, const at::Tensor& b,
                            const ConsumerCall& c) {
  const at::Tensor a = consumer_input(act_h, w);
  const std::optional<at::Tensor> bias = b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
  switch (c.spatial) {
    case 0:
      return at::linear(a, w, bias);
    case 1:
      return at::conv1d_symint(a, w, bias, c.stride, c.padding, c.dilation, c.groups);
    case 2:
      return at::conv2d_symint(a, w, bias, c.stride, c.padding, c.dilation, c.groups);
    default:
      return at::conv3d_symint(a, w, bias, c.stride, c.padding, c.dilation, c.groups);
  }
}

struct ActConsumerFunction : public torch::autograd::Function<ActConsumerFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                            const at::Tensor& b_arg, const ConsumerCall& c) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor b = c.has_bias ? b_arg : at::Tensor();
    at::Tensor out = consumer_forward(act_recompute(h, c.act, c.params), w, b, c);
    ctx->save_for_backward({h, w});
    ctx->saved_data["spatial"] = c.spatial;
    ctx->saved_data["stride"] = c.stride;
    ctx->saved_data["padding"] = c.padding;
    ctx->saved_data["dilation"] = c.dilation;
    ctx->saved_data["groups"] = c.groups;
    ctx->saved_data["act"] = c.act;
    ctx->saved_data["params"] = c.params;
    ctx->saved_data["has_bias"] = c.has_bias;
    if (c.has_bias) ctx->saved_data["bias_sizes"] = b.sym_sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::act_*: double backward is not supported (the backward recomputes the "
                "activation); use the aten ops where higher-order gradients are needed");
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto s = ctx->get_saved_variables();
    const at::Tensor &h = s[0], &w = s[1];
    const std::string act = ctx->saved_data["act"].toStringRef();
    const std::vector<double> params = ctx->saved_data["params"].toDoubleVector();
    const int64_t spatial = ctx->saved_data["spatial"].toInt();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1),
               need_b = has_bias && ctx->needs_input_grad(2);
    // With h's gradient to compute, gelu and its derivative in one pass (aten's to
    // rounding); else act(h) with aten's op, bit for bit the forward's.
    at::Tensor a, da;
    if (auto ad = need_h ? act_with_derivative(h, act) : std::nullopt)
      std::tie(a, da) = *ad;
    else
      a = act_recompute(h, act, params);
    // The consumer's input: act(h) in the weight's dtype (a copy under autocast).
    const at::Tensor ac = consumer_input(a, w);
    at::Tensor ga, gw, gb;
    if (spatial == 0) {
      const int64_t out_f = w.size(0);
      const at::Tensor g2 = g.reshape({-1, out_f});
      if (need_h) ga = g.matmul(w);
      if (need_w) gw = g2.t().mm(ac.reshape({-1, ac.size(-1)}));
      if (need_b) gb = g2.sum(0);
    } else {
      std::vector<c10::SymInt> zeros(spatial, 0);
      std::optional<std::vector<c10::SymInt>> bias_sizes;
      if (has_bias) bias_sizes = ctx->saved_data["bias_sizes"].toSymIntVector();
      auto [gi, gww, gbb] = at::convolution_backward_symint(
          g, ac, w, bias_sizes ? at::OptionalSymIntArrayRef(*bias_sizes) : std::nullopt,
          ctx->saved_data["stride"].toSymIntVector(), ctx->saved_data["padding"].toSymIntVector(),
          ctx->saved_data["dilation"].toSymIntVector(), false, zeros,
          ctx->saved_data["groups"].toSymInt(), {need_h, need_w, need_b});
      ga = gi, gw = gww, gb = gbb;
    }
    // The cast's backward: act(h)'s gradient in h's dtype, as autograd casts it.
    if (ga.defined() && ga.scalar_type() != h.scalar_type()) ga = ga.to(h.scalar_type());
    at::Tensor gh =
        !need_h ? at::Tensor()
        : da.defined()
            ? (ga.is_contiguous() && ga.strides() == da.strides() ? ga.mul_(da) : ga * da)
            : act_recompute_backward(ga, h, a, act, params);
    return {gh, gw, gb, at::Tensor()};
  }
};

at::Tensor act_consumer(const at::Tensor& h, const at::Tensor& w,
                        const std::optional<at::Tensor>& bias, ConsumerCall c) {
  const at::Tensor b = bias && bias->defined() ? *bias : at::Tensor();
  const bool grad = at::GradMode::is_enabled() &&
                    (h.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return consumer_forward(act_recompute(h, c.act, c.params), w, b, c);
  }
  c.has_bias = b.defined();
  return ActConsumerFunction::apply(h, w, b.defined() ? b : at::empty({0}, h.options()), c);
}

ConsumerCall conv_call(int64_t spatial, c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
                       c10::SymIntArrayRef dilation, c10::SymInt groups, c10::string_view act,
                       at::ArrayRef<double> params) {
  ConsumerCall c;
  c.spatial = spatial;
  c.stride.assign(stride.begin(), stride.end());
  c.padding.assign(padding.begin(), padding.end());
  c.dilation.assign(dilation.begin(), dilation.end());
  c.groups = std::move(groups);
  c.act = std::string(act);
  c.params.assign(params.begin(), params.end());
  return c;
}

// Kernels of the public ops (Autograd and the plain forward), one pair each.
at::Tensor act_linear_autograd(const at::Tensor& h, const at::Tensor& w,
                               const std::optional<at::Tensor>& b, c10::string_view act,
                               at::ArrayRef<double> params) {
  return act_consumer(h, w, b, conv_call(0, {}, {}, {}, 1, act, params));
}
at::Tensor act_linear_plain(const at::Tensor& h, const at::Tensor& w,
                            const std::optional<at::Tensor>& b, c10::string_view act,
                            at::ArrayRef<double> params) {
  ConsumerCall c = conv_call(0, {}, {}, {}, 1, act, params);
  return consumer_forward(act_recompute(h, c.act, c.params), w, b ? *b : at::Tensor(), c);
}

#define MEMSLIM_CONV_KERNELS(NAME, SPATIAL)                                                     \
  at::Tensor act_##NAME##_autograd(const at::Tensor& h, const at::Tensor& w,                    \
                                   const std::optional<at::Tensor>& b, c10::SymIntArrayRef s,   \
                                   c10::SymIntArrayRef p, c10::SymIntArrayRef d, c10::SymInt g, \
                                   c10::string_view act, at::ArrayRef<double> params) {         \
    return act_consumer(h, w, b, conv_call(SPATIAL, s, p, d, std::move(g), act, params));       \
  }                                                                                             \
  at::Tensor act_##NAME##_plain(const at::Tensor& h, const at::Tensor& w,                       \
                                const std::optional<at::Tensor>& b, c10::SymIntArrayRef s,      \
                                c10::SymIntArrayRef p, c10::SymIntArrayRef d, c10::SymInt g,    \
                                c10::string_view act, at::ArrayRef<double> params) {            \
    ConsumerCall c = conv_call(SPATIAL, s, p, d, std::move(g), act, params);                    \
    return consumer_forward(act_recompute(h, c.act, c.params), w, b ? *b : at::Tensor(), c);    \
  }
MEMSLIM_CONV_KERNELS(conv1d, 1)
MEMSLIM_CONV_KERNELS(conv2d, 2)
MEMSLIM_CONV_KERNELS(conv3d, 3)
#undef MEMSLIM_CONV_KERNELS

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
#define MEMSLIM_CONSUMER(NAME, ...) m.impl("act_" #NAME, TORCH_FN(act_##NAME##_autograd));
#include "memslim/kernels/consumer_table.def"
}

// The plain forward is aten's on every backend (Meta included).
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
#define MEMSLIM_CONSUMER(NAME, ...) m.impl("act_" #NAME, TORCH_FN(act_##NAME##_plain));
#include "memslim/kernels/consumer_table.def"
}

} // namespace memslim
