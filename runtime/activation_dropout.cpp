//===- activation_dropout.cpp - dropout(act(x)) that keeps output + bits ----===//
//
// What: memslim::activation_dropout. Forward = the activation (memslim's
// saving forward), then dropout exactly as aten does it on this device (CPU:
// noise = empty_like(y).bernoulli_(1-p).div_(1-p), out = y * noise; CUDA:
// native_dropout), so the same seed gives the same values as aten's pair.
// Saved: out (shared with the next layer), the dropout keep-mask as packed
// bits (memory order), and the activation's bits and exact list. Backward:
// grad * noise (rebuilt from the bits), then the activation's backward at
// y = out / scale (kept elements; dropped ones get zero gradient anyway).
// Why: in nn.TransformerEncoderLayer dropout sits between GELU and linear2, so
// swapping GELU alone frees nothing (dropout keeps float noise, GELU its input).
// Also memslim::dropout_draw / bernoulli_draw: a dropout's draw alone (aten's
// native_dropout's keep-mask, aten's bernoulli), which memslim's Inductor guard
// puts in place of an unused dropout so that eager's draws survive Inductor in
// eager's order (schema.cpp says why).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "memslim/activation_ops.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Sizes are SymInts throughout: symbolic under torch.compile's dynamic shapes.

// A dense tensor's elements in memory order, as a 1-D view.
at::Tensor memory_order(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.is_non_overlapping_and_dense());
  return t.as_strided_symint({t.sym_numel()}, {1}, t.sym_storage_offset());
}

at::Tensor pack_bits(const at::Tensor& keep_flat) { // bool [n] -> uint8 [ceil(n/8)]
  const c10::SymInt n = keep_flat.sym_numel(), ng = (n + 7) / 8;
  at::Tensor padded = at::zeros_symint({ng * 8}, keep_flat.options().dtype(at::kByte));
  padded.narrow_symint(0, 0, n).copy_(keep_flat);
  at::Tensor weights = at::pow(2, at::arange(8, keep_flat.options().dtype(at::kInt))).to(at::kByte);
  return padded.view_symint({ng, 8}).mul(weights).sum(1, false, at::kByte);
}

at::Tensor unpack_bits(const at::Tensor& bits, const c10::SymInt& n) { // uint8 -> 0/1 [n]
  at::Tensor shifts = at::arange(8, bits.options());
  return bits.unsqueeze(1).bitwise_right_shift(shifts).bitwise_and(1).flatten().narrow_symint(0, 0,
                                                                                              n);
}

struct ActivationDropoutFunction : public torch::autograd::Function<ActivationDropoutFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const ActSpec& spec,
                            double p) {
    at::AutoDispatchBelowADInplaceOrView guard;
    // The activation forward learns the factor its output is saved with
    // (params[3], ActParams::out_scale): kept elements whose y / (1 - p)
    // overflows the dtype (fp16: y > 45853 at p = 0.3) cannot give y back in
    // backward and go to the exact list. 1/512 of margin: aten's fp16 noise
    // is 1/(1-p) rounded to fp16 on CPU, in float in CUDA's fused kernel.
    ActSpec fwd = spec;
    fwd.params.resize(3, 0.0);
    fwd.params.push_back(1.0 / (1.0 - p) * (1.0 + 1.0 / 512));
    auto [y, bits, idx, val] = call_activation_forward(x, fwd, /*save=*/true);
    at::Tensor out, keep;
    if (y.is_cuda()) {
      auto r = at::native_dropout(y, p, true);
      out = std::get<0>(r);
      keep = std::get<1>(r);
    } else {
      at::Tensor noise = at::empty_like(y).bernoulli_(1 - p);
      noise.div_(1 - p);
      out = y.mul(noise);
      keep = noise.ne(0);
    }
    const bool keep_bits = act_keeps_bits(spec.act, spec.params);
    const bool exact = act_keeps_exact_list(fwd.act, fwd.params, x.scalar_type());
    ctx->save_for_backward({out, keep_bits ? bits : at::Tensor(), exact ? idx : at::Tensor(),
                            exact ? val : at::Tensor(), pack_bits(memory_order(keep))});
    ctx->saved_data["act"] = spec.act;
    ctx->saved_data["params"] = spec.params;
    ctx->saved_data["p"] = p;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::activation_dropout: double backward is not supported");
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto saved = ctx->get_saved_variables();
    const at::Tensor& out = saved[0];
    const double p = ctx->saved_data["p"].toDouble();
    // noise = keep * (1 / (1 - p)), computed as aten computes its scale.
    const at::Tensor scale = at::ones({}, out.options()).div_(1 - p);
    at::Tensor noise = at::empty_like(out);
    memory_order(noise).copy_(unpack_bits(saved[4], out.sym_numel()));
    noise.mul_(scale);
    const at::Tensor gm = g.mul(noise); // conformed to out's layout by the call below
    at::Tensor gi = call_activation_backward(
        gm, out.sym_sizes(), out.sym_strides(), out.div(scale), saved[1], saved[2], saved[3],
        ctx->saved_data["act"].toStringRef(), ctx->saved_data["params"].toDoubleVector());
    return {gi, at::Tensor(), at::Tensor()};
  }
};

ActSpec spec_from(c10::string_view act, at::ArrayRef<double> params) {
  const std::string a(act);
  check_param_count("activation_dropout", a, params.size()); // and the name
  return {"activation_dropout", a, params.vec()};
}

at::Tensor activation_dropout_autograd(const at::Tensor& x, c10::string_view act,
                                       at::ArrayRef<double> params, double p, bool train,
                                       int64_t /*instance*/) {
  TORCH_CHECK(p >= 0 && p <= 1,
              "memslim::activation_dropout: dropout probability has to be "
              "between 0 and 1, but got ",
              p);
  const ActSpec spec = spec_from(act, params);
  const kernels::SaveKind kind = kernels::save_kind(act_from_name(spec.act));
  TORCH_CHECK(kind != kernels::SaveKind::Mask, "memslim::activation_dropout: '", spec.act,
              "' keeps only a mask; it needs no fusion with dropout");
  if (!train || p == 0 || x.sym_numel() == 0) return activation_with_autograd(x, spec);
  if (p == 1) return activation_with_autograd(x, spec).mul(at::zeros({}, x.options()));
  if (at::GradMode::is_enabled() && x.requires_grad())
    return ActivationDropoutFunction::apply(x, spec, p);
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::dropout(activation_with_autograd(x, spec), p, train);
}

at::Tensor activation_dropout_meta(const at::Tensor& x, c10::string_view act, at::ArrayRef<double>,
                                   double, bool, int64_t) {
  check_dtype(x, std::string(act));
  return at::empty_like(x);
}

// memslim::dropout_draw: aten's own dropout for its draw (every device draws as
// aten does there); the keep-mask, bool.
at::Tensor dropout_draw(const at::Tensor& x, double p) {
  return std::get<1>(at::native_dropout(x, p, true));
}

at::Tensor dropout_draw_meta(const at::Tensor& x, double) {
  return at::empty_like(x, x.options().dtype(at::kBool));
}

// memslim::bernoulli_draw: aten's bernoulli(input, p), its draws as aten's.
at::Tensor bernoulli_draw(const at::Tensor& x, double p) { return at::bernoulli(x, p); }

at::Tensor bernoulli_draw_meta(const at::Tensor& x, double) { return at::empty_like(x); }

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
  m.impl("activation_dropout", TORCH_FN(activation_dropout_autograd));
}
// Below autograd (inference_mode) the same composition runs per device.
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("activation_dropout",
         [](const at::Tensor& x, c10::string_view act, at::ArrayRef<double> params, double p,
            bool train, int64_t /*instance*/) {
           return at::dropout(activation_with_autograd(x, spec_from(act, params)), p, train);
         });
  m.impl("dropout_draw", TORCH_FN(dropout_draw));
  m.impl("bernoulli_draw", TORCH_FN(bernoulli_draw));
}
TORCH_LIBRARY_IMPL(memslim, Meta, m) {
  m.impl("activation_dropout", TORCH_FN(activation_dropout_meta));
  m.impl("dropout_draw", TORCH_FN(dropout_draw_meta));
  m.impl("bernoulli_draw", TORCH_FN(bernoulli_draw_meta));
}

} // namespace memslim
