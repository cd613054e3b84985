//===- gated_ops.cpp - linear(act(g) * u) keeping g and u ------------------===//
//
// What: memslim::gated_linear(gate, up, weight, bias, act, params): aten's
// linear(act(gate) * up, weight, bias), the down projection of a gated MLP
// (SwiGLU: silu, Llama / Mistral / Qwen; GeGLU: gelu, Gemma / T5 v1.1), where
// act is a kernel activation of activation_table.def (`act`, `params` as
// act_linear takes them). The Autograd kernel keeps gate, up and the weight:
// backward recomputes act(gate) and the product (two pointwise passes), runs
// aten's linear backward on the product, and takes the product's gradient
// into gate (aten's own activation backward) and up. Values and gradients are
// aten's exactly: the same ops on the same values, recomputed bit for bit.
// Why: aten keeps gate (the activation's input), act(gate) and up (the mul's)
// and the product (the linear's input): four tensors of the MLP's width where
// gate and up suffice.
// Double backward is not supported (a create_graph backward raises).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "memslim/act_recompute.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor gated_forward(const at::Tensor& g, const at::Tensor& u, const at::Tensor& w,
                         const at::Tensor& b, const std::string& act, at::ArrayRef<double> params) {
  return at::linear(act_recompute(g, act, params) * u, w,
                    b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

struct GatedLinearFunction : public torch::autograd::Function<GatedLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& u,
                            const at::Tensor& w, const at::Tensor& b_arg, bool has_bias,
                            const std::string& act, const std::vector<double>& params) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor b = has_bias ? b_arg : at::Tensor();
    at::Tensor out = gated_forward(g, u, w, b, act, params);
    ctx->save_for_backward({g, u, w});
    ctx->saved_data["act"] = act;
    ctx->saved_data["params"] = params;
    ctx->saved_data["has_bias"] = has_bias;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::gated_linear: double backward is not supported (the backward "
                "recomputes the gated product); use the aten ops where higher-order "
                "gradients are needed");
    const at::Tensor& go = grads[0];
    variable_list out(7);
    if (!go.defined()) return out;
    auto s = ctx->get_saved_variables();
    const at::Tensor &g = s[0], &u = s[1], &w = s[2];
    const std::string act = ctx->saved_data["act"].toStringRef();
    const std::vector<double> params = ctx->saved_data["params"].toDoubleVector();
    const bool need_g = ctx->needs_input_grad(0), need_u = ctx->needs_input_grad(1),
               need_w = ctx->needs_input_grad(2),
               need_b = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3);
    const at::Tensor a = act_recompute(g, act, params);
    const int64_t out_f = w.size(0);
    const at::Tensor go2 = go.reshape({-1, out_f});
    if (need_w) {
      const at::Tensor p = a * u;
      out[2] = go2.t().mm(p.reshape({-1, p.size(-1)}));
    }
    if (need_b) out[3] = go2.sum(0);
    if (need_g || need_u) {
      const at::Tensor gp = go.matmul(w); // d product
      if (need_u) out[1] = gp * a;
      if (need_g) out[0] = act_recompute_backward(gp * u, g, a, act, params);
    }
    return out;
  }
};

at::Tensor gated_linear_autograd(const at::Tensor& g, const at::Tensor& u, const at::Tensor& w,
                                 const std::optional<at::Tensor>& bias, c10::string_view act,
                                 at::ArrayRef<double> params) {
  const at::Tensor b = bias && bias->defined() ? *bias : at::Tensor();
  const bool grad =
      at::GradMode::is_enabled() && (g.requires_grad() || u.requires_grad() || w.requires_grad() ||
                                     (b.defined() && b.requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return gated_forward(g, u, w, b, std::string(act), params);
  }
  return GatedLinearFunction::apply(g, u, w, b.defined() ? b : at::empty({0}, g.options()),
                                    b.defined(), std::string(act),
                                    std::vector<double>(params.begin(), params.end()));
}

at::Tensor gated_linear_plain(const at::Tensor& g, const at::Tensor& u, const at::Tensor& w,
                              const std::optional<at::Tensor>& bias, c10::string_view act,
                              at::ArrayRef<double> params) {
  return gated_forward(g, u, w, bias && bias->defined() ? *bias : at::Tensor(), std::string(act),
                       params);
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
  m.impl("gated_linear", TORCH_FN(gated_linear_autograd));
}

// The plain forward is aten's on every backend (Meta included).
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("gated_linear", TORCH_FN(gated_linear_plain));
}

} // namespace memslim
