//===- activation_autograd.cpp - Autograd kernels that save less ------------===//
//
// What: one torch::autograd::Function for every activation. Its forward calls
// memslim::activation_forward (through the dispatcher, so fake tensors and
// torch.compile trace it) and saves the output plus packed bits, an exact list
// near a minimum, or only a mask; its backward calls
// memslim::activation_backward, itself a registered op with a Meta kernel.
// When the input does not require grad the op redispatches below autograd and
// saves nothing.
// Double backward: not supported; the saved output and bits determine the
// first derivative only, so a create_graph backward raises a clear error.
//
//===----------------------------------------------------------------------===//
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "memslim/activation_ops.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardOp = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&,
                                                                             c10::string_view,
                                                                             at::ArrayRef<double>,
                                                                             bool);
using BackwardOp = at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              c10::string_view, at::ArrayRef<double>);
using PlainOp = at::Tensor(const at::Tensor&);

const c10::TypedOperatorHandle<ForwardOp>& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("memslim::activation_forward", "")
                             .typed<ForwardOp>();
  return op;
}
const c10::TypedOperatorHandle<BackwardOp>& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("memslim::activation_backward", "")
                             .typed<BackwardOp>();
  return op;
}

struct ActivationFunction : public torch::autograd::Function<ActivationFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const ActSpec& spec) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, bits, idx, val] = call_activation_forward(x, spec, /*save=*/true);
    const kernels::Act a = act_from_name(spec.act);
    const bool mask = kernels::save_kind(a) == kernels::SaveKind::Mask;
    // From the rules, not from sizes: under fake tensors sizes are symbolic.
    const bool keep_bits = act_keeps_bits(spec.act, spec.params);
    const bool exact = act_keeps_exact_list(spec.act, spec.params, x.scalar_type());
    ctx->save_for_backward({mask ? at::Tensor() : y, keep_bits ? bits : at::Tensor(),
                            exact ? idx : at::Tensor(), exact ? val : at::Tensor()});
    ctx->saved_data["act"] = spec.act;
    if (!spec.params.empty()) ctx->saved_data["params"] = spec.params;
    // The layout bits refer to: y's (dense) sizes and strides, symbolic under
    // torch.compile's dynamic shapes; only where y is not contiguous (each
    // entry costs an allocation per call: issue 13's per-call overhead).
    if (!y.is_contiguous_or_false()) {
      ctx->saved_data["sizes"] = y.sym_sizes().vec();
      ctx->saved_data["strides"] = y.sym_strides().vec();
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(), "memslim: ", ctx->saved_data["act"].toStringRef(),
                ": double backward is not supported (the backward keeps only the output and "
                "packed bits); use the aten op where higher-order gradients are needed");
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    auto saved = ctx->get_saved_variables();
    const auto params = ctx->saved_data.find("params");
    const auto act = ctx->saved_data.find("act");
    const std::vector<double> pv =
        params == ctx->saved_data.end() ? std::vector<double>{} : params->second.toDoubleVector();
    // y's layout where it was not contiguous; else grad made contiguous.
    const auto layout = ctx->saved_data.find("sizes");
    const bool dense = layout == ctx->saved_data.end();
    std::vector<c10::SymInt> sizes, strides;
    if (!dense) {
      sizes = layout->second.toSymIntVector();
      strides = ctx->saved_data["strides"].toSymIntVector();
    }
    const at::Tensor gi =
        call_activation_backward(dense ? g.contiguous() : g, sizes, strides, saved[0], saved[1],
                                 saved[2], saved[3], act->second.toStringRef(), pv);
    return {gi, at::Tensor()};
  }
};

} // namespace

at::Tensor activation_with_autograd(const at::Tensor& x, const ActSpec& spec) {
  check_dtype(x, spec.op);
  if (at::GradMode::is_enabled() && x.requires_grad()) return ActivationFunction::apply(x, spec);
  // Nothing to differentiate: run the plain forward below autograd.
  at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(call_activation_forward(x, spec, /*save=*/false));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_activation_forward(
    const at::Tensor& x, const ActSpec& spec, bool save) {
  return forward_op().call(x, spec.act, spec.params, save);
}

at::Tensor call_activation_backward(at::Tensor g, c10::SymIntArrayRef sizes,
                                    c10::SymIntArrayRef strides, const at::Tensor& out,
                                    const at::Tensor& bits, const at::Tensor& exact_idx,
                                    const at::Tensor& exact_val, const std::string& act,
                                    const std::vector<double>& params) {
  if (!strides.empty() && g.sym_strides() != strides)
    g = at::empty_strided_symint(sizes, strides, g.options()).copy_(g);
  // Undefined saved tensors (an op that keeps no bits or exact list) go in as
  // one empty tensor: the op reads none of a zero-length list (one allocation
  // per call instead of three: issue 13's per-call overhead).
  at::Tensor none;
  auto or_empty = [&](const at::Tensor& t) -> const at::Tensor& {
    if (t.defined()) return t;
    if (!none.defined()) none = at::empty({0}, g.options().dtype(at::kByte));
    return none;
  };
  std::optional<at::Tensor> o;
  if (out.defined()) o = out;
  return backward_op().call(g, o, or_empty(bits), or_empty(exact_idx), or_empty(exact_val), act,
                            params);
}

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
#define MEMSLIM_OP(NAME, ...) m.impl(#NAME, TORCH_FN(OpKernels<::memslim::spec_##NAME>::autograd));
#include "memslim/kernels/activation_table.def"
}

} // namespace memslim
