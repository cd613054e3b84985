//===- loss_head_ops.cpp - cross_entropy(linear(h, W)) without the logits -===//
//
// What: memslim::linear_cross_entropy(input, weight, bias, target, reduction,
// ignore_index, label_smoothing, logits_dtype, chunk): aten's
// cross_entropy(linear(input, weight, bias)[.to(logits_dtype)], target, ...)
// for class-index targets, computed `chunk` rows of tokens at a time. Forward
// keeps the input, the targets and one log-sum-exp per row (opmath); backward
// recomputes each chunk's logits, turns them into the logits' gradient
// (softmax - one-hot, label smoothing and the reduction's scale folded in)
// and runs linear's backward on the chunk, accumulating the weight's gradient
// in place (in fp32 for 16-bit weights). Neither the logits nor softmax's
// output ever exist whole: the step's peak holds one chunk of them.
// Values: the loss is aten's to rounding (the log-sum-exp in opmath; label
// smoothing as aten's: both terms' mean divides by the rows not ignored); the gradients
// are aten's to the rounding of chunked accumulation. Targets outside
// [0, vocab) other than ignore_index are an error on the CPU, as in aten.
// The forward and backward are internal ops (linear_cross_entropy_forward /
// _backward: CompositeExplicitAutograd kernels over aten ops, so every device
// runs them, and Meta kernels), so torch.compile's partitioner sees two opaque
// calls and cannot save the logits between them.
// Why: in language models the head's logits (tokens x vocabulary, plus
// log_softmax's output) are the largest activation of the step.
// Double backward is not supported (a create_graph backward raises).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>

#include "memslim/plain_cpu.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kNone = 0, kMean = 1, kSum = 2; // at::Reduction

// One call's non-tensor arguments.
struct LceCall {
  int64_t reduction = kMean;
  int64_t ignore_index = -100;
  double smoothing = 0.0;
  std::optional<at::ScalarType> logits_dtype;
  int64_t chunk = 0;
};

// The rows of one chunk: `chunk` when given, else as many as keep a chunk's
// logits near 4 Mi elements (16 MiB in fp32; the matmul stays efficient).
int64_t rows_per_chunk(int64_t rows, int64_t vocab, int64_t chunk) {
  const int64_t n = std::max<int64_t>(rows, 1);
  if (chunk > 0) return std::min(chunk, n);
  return std::clamp<int64_t>((int64_t{1} << 22) / std::max<int64_t>(vocab, 1), 1, n);
}

at::ScalarType logits_type(const at::Tensor& input, const LceCall& c) {
  return c.logits_dtype.value_or(input.scalar_type());
}

// One chunk's logits as the model computes them: linear in the input's dtype,
// then the model's cast.
at::Tensor chunk_logits(const at::Tensor& hc, const at::Tensor& w, const at::Tensor& b,
                        const LceCall& c) {
  at::Tensor z = at::linear(hc, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  if (c.logits_dtype && *c.logits_dtype != z.scalar_type()) z = z.to(*c.logits_dtype);
  return z;
}

void check_args(const at::Tensor& input, const at::Tensor& w, const at::Tensor& target,
                const LceCall& c) {
  TORCH_CHECK(input.dim() >= 1 && w.dim() == 2 && input.sym_size(-1) == w.sym_size(1),
              "memslim::linear_cross_entropy: input [..., d] and weight [vocab, d] expected");
  TORCH_CHECK(!at::isFloatingType(target.scalar_type()) && !at::isComplexType(target.scalar_type()),
              "memslim::linear_cross_entropy: targets must be class indices");
  TORCH_CHECK(target.sym_numel() * input.sym_size(-1) == input.sym_numel(),
              "memslim::linear_cross_entropy: one target per row of the input expected");
  TORCH_CHECK(c.reduction == kNone || c.reduction == kMean || c.reduction == kSum,
              "memslim::linear_cross_entropy: reduction must be 0 (none), 1 (mean) or 2 (sum)");
  TORCH_CHECK(c.smoothing >= 0.0 && c.smoothing <= 1.0,
              "memslim::linear_cross_entropy: label_smoothing must be in [0, 1]");
}

// aten's "Target N is out of bounds." where values can be read (the CPU).
void check_targets(const at::Tensor& t, const at::Tensor& valid, int64_t vocab) {
  if (!plain_cpu(t) || t.numel() == 0) return;
  const at::Tensor bad = ((t < 0) | (t >= vocab)).logical_and_(valid);
  if (bad.any().item<bool>()) {
    const int64_t first = t.masked_select(bad)[0].item<int64_t>();
    TORCH_CHECK_INDEX(false, "Target ", first, " is out of bounds.");
  }
}

std::tuple<at::Tensor, at::Tensor> lce_forward(const at::Tensor& input, const at::Tensor& w,
                                               const at::Tensor& b, const at::Tensor& target,
                                               const LceCall& c) {
  check_args(input, w, target, c);
  const int64_t d = input.size(-1), vocab = w.size(0);
  const at::Tensor h = input.reshape({-1, d}), t = target.reshape({-1});
  const int64_t rows = h.size(0);
  const at::ScalarType zt = logits_type(input, c), op = at::toOpMathType(zt);
  const auto opts = input.options().dtype(op);
  at::Tensor lse = at::empty({rows}, opts), nll = at::empty({rows}, opts);
  at::Tensor smooth = c.smoothing > 0 ? at::empty({rows}, opts) : at::Tensor();
  const at::Tensor valid = t != c.ignore_index;
  check_targets(t, valid, vocab);
  const at::Tensor safe_t = t.masked_fill(valid.logical_not(), 0);
  const int64_t step = rows_per_chunk(rows, vocab, c.chunk);
  for (int64_t s = 0; s < rows; s += step) {
    const int64_t n = std::min(step, rows - s);
    const at::Tensor zf = chunk_logits(h.narrow(0, s, n), w, b, c).to(op);
    const at::Tensor lse_c = at::logsumexp(zf, {1});
    lse.narrow(0, s, n).copy_(lse_c);
    const at::Tensor picked = zf.gather(1, safe_t.narrow(0, s, n).unsqueeze(1)).squeeze(1);
    // + (lse - lse): NaN where a logit is +inf, as log_softmax's inf - inf.
    nll.narrow(0, s, n).copy_((lse_c - picked).add_(lse_c - lse_c));
    // -sum_j log_softmax(z)_j = vocab * lse - sum_j z_j
    if (smooth.defined()) smooth.narrow(0, s, n).copy_(lse_c * vocab - zf.sum(1));
  }
  const at::Tensor invalid = valid.logical_not();
  nll.masked_fill_(invalid, 0);
  if (smooth.defined()) smooth.masked_fill_(invalid, 0);
  at::Tensor loss;
  if (c.reduction == kNone) {
    loss = nll;
  } else if (c.reduction == kSum) {
    loss = nll.sum();
  } else {
    loss = nll.sum() / valid.sum().to(op);
  }
  if (smooth.defined()) {
    const at::Tensor sm = c.reduction == kNone  ? smooth
                          : c.reduction == kSum ? smooth.sum()
                                                : smooth.sum() / valid.sum().to(op);
    loss = loss * (1.0 - c.smoothing) + sm * (c.smoothing / static_cast<double>(vocab));
  }
  if (c.reduction == kNone) loss = loss.reshape(target.sizes());
  return {loss.to(zt), lse};
}

// The logits' gradient of one chunk, in opmath: per row, scale * (softmax -
// (1 - eps) * one-hot - eps / vocab); `scale` is zero on ignored rows.
at::Tensor chunk_logits_grad(const at::Tensor& zf, const at::Tensor& lse_c,
                             const at::Tensor& safe_tc, const at::Tensor& scale, double eps,
                             int64_t vocab) {
  at::Tensor g = (zf - lse_c.unsqueeze(1)).exp_().mul_(scale.unsqueeze(1));
  g.scatter_add_(1, safe_tc.unsqueeze(1), (scale * -(1.0 - eps)).unsqueeze(1));
  if (eps > 0) g.sub_((scale * (eps / static_cast<double>(vocab))).unsqueeze(1));
  return g;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& w, const at::Tensor& b,
    const at::Tensor& target, const at::Tensor& lse, const LceCall& c, std::array<bool, 3> mask) {
  const int64_t d = input.size(-1), vocab = w.size(0);
  const at::Tensor h = input.reshape({-1, d}), t = target.reshape({-1});
  const int64_t rows = h.size(0);
  const at::ScalarType op = lse.scalar_type();
  const at::Tensor valid = t != c.ignore_index;
  const at::Tensor valid_f = valid.to(op), safe_t = t.masked_fill(valid.logical_not(), 0);
  // The loss's gradient per row (both terms share the reduction's divisor).
  at::Tensor scale;
  const at::Tensor g = grad.to(op);
  if (c.reduction == kNone) {
    scale = g.reshape({-1}) * valid_f;
  } else if (c.reduction == kSum) {
    scale = valid_f * g;
  } else {
    scale = valid_f * (g / valid.sum().to(op));
  }
  // Rows whose log-sum-exp is not finite get NaN gradients, ignored rows too:
  // aten's log_softmax backward multiplies their NaN softmax by zero.
  scale.add_(lse - lse);
  const bool wide = w.scalar_type() != op; // 16-bit weights: accumulate in opmath
  at::Tensor gh = mask[0] ? at::empty_like(h) : at::Tensor();
  at::Tensor gw =
      mask[1] ? at::zeros(w.sizes(), w.options().dtype(wide ? op : w.scalar_type())) : at::Tensor();
  at::Tensor gb =
      mask[2] && b.defined() ? at::zeros(b.sizes(), b.options().dtype(op)) : at::Tensor();
  const int64_t step = rows_per_chunk(rows, vocab, c.chunk);
  for (int64_t s = 0; s < rows; s += step) {
    const int64_t n = std::min(step, rows - s);
    const at::Tensor hc = h.narrow(0, s, n);
    const at::Tensor z = chunk_logits(hc, w, b, c);
    at::Tensor gz = chunk_logits_grad(z.to(op), lse.narrow(0, s, n), safe_t.narrow(0, s, n),
                                      scale.narrow(0, s, n), c.smoothing, vocab);
    // linear's backward in the linear's dtype (the model's cast, backwards).
    const at::Tensor gl = gz.to(hc.scalar_type());
    if (gh.defined()) {
      at::Tensor rows_out = gh.narrow(0, s, n);
      at::mm_out(rows_out, gl, w);
    }
    if (gw.defined()) {
      if (wide)
        gw.add_(at::mm(gl.t(), hc));
      else
        gw.addmm_(gl.t(), hc);
    }
    if (gb.defined()) gb.add_(gl.sum(0, false, op));
  }
  if (gh.defined()) gh = gh.reshape(input.sizes());
  if (gw.defined() && wide) gw = gw.to(w.scalar_type());
  if (gb.defined()) gb = gb.to(b.scalar_type());
  return {gh, gw, gb};
}

LceCall make_call(int64_t reduction, int64_t ignore_index, double smoothing,
                  std::optional<at::ScalarType> logits_dtype, int64_t chunk) {
  return LceCall{reduction, ignore_index, smoothing, logits_dtype, chunk};
}

at::Tensor or_empty(const std::optional<at::Tensor>& b) {
  return b && b->defined() ? *b : at::Tensor();
}

// Kernels of the internal ops: device-generic (aten ops) and Meta.
std::tuple<at::Tensor, at::Tensor> forward_impl(const at::Tensor& input, const at::Tensor& w,
                                                const std::optional<at::Tensor>& b,
                                                const at::Tensor& target, int64_t reduction,
                                                int64_t ignore_index, double smoothing,
                                                std::optional<at::ScalarType> logits_dtype,
                                                int64_t chunk) {
  return lce_forward(input, w, or_empty(b), target,
                     make_call(reduction, ignore_index, smoothing, logits_dtype, chunk));
}

std::tuple<at::Tensor, at::Tensor> forward_meta(const at::Tensor& input, const at::Tensor& w,
                                                const std::optional<at::Tensor>& b,
                                                const at::Tensor& target, int64_t reduction,
                                                int64_t ignore_index, double smoothing,
                                                std::optional<at::ScalarType> logits_dtype,
                                                int64_t chunk) {
  const LceCall c = make_call(reduction, ignore_index, smoothing, logits_dtype, chunk);
  check_args(input, w, target, c);
  const at::ScalarType zt = logits_type(input, c);
  const auto opts = input.options().dtype(zt);
  at::Tensor loss =
      reduction == kNone ? at::empty_symint(target.sym_sizes(), opts) : at::empty({}, opts);
  at::Tensor lse = at::empty_symint({target.sym_numel()}, opts.dtype(at::toOpMathType(zt)));
  return {loss, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& w,
    const std::optional<at::Tensor>& b, const at::Tensor& target, const at::Tensor& lse,
    int64_t reduction, int64_t ignore_index, double smoothing,
    std::optional<at::ScalarType> logits_dtype, int64_t chunk, std::array<bool, 3> mask) {
  return lce_backward(grad, input, w, or_empty(b), target, lse,
                      make_call(reduction, ignore_index, smoothing, logits_dtype, chunk), mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_meta(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& w,
    const std::optional<at::Tensor>& b, const at::Tensor& target, const at::Tensor& lse,
    int64_t reduction, int64_t ignore_index, double smoothing,
    std::optional<at::ScalarType> logits_dtype, int64_t chunk, std::array<bool, 3> mask) {
  return {mask[0] ? at::empty_like(input) : at::Tensor(),
          mask[1] ? at::empty_like(w) : at::Tensor(),
          mask[2] && b && b->defined() ? at::empty_like(*b) : at::Tensor()};
}

// The internal ops through the dispatcher (torch.compile traces them as calls).
std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& input, const at::Tensor& w,
                                                const at::Tensor& b, const at::Tensor& target,
                                                const LceCall& c) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("memslim::linear_cross_entropy_forward", "")
                       .typed<decltype(forward_impl)>();
  return op.call(input, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, target,
                 c.reduction, c.ignore_index, c.smoothing, c.logits_dtype, c.chunk);
}

struct LceFunction : public torch::autograd::Function<LceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& w,
                            const at::Tensor& b_arg, const at::Tensor& target, const LceCall& c,
                            bool has_bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor b = has_bias ? b_arg : at::Tensor();
    auto [loss, lse] = call_forward(input, w, b, target, c);
    ctx->save_for_backward({input, w, b_arg, target, lse});
    ctx->saved_data["reduction"] = c.reduction;
    ctx->saved_data["ignore_index"] = c.ignore_index;
    ctx->saved_data["smoothing"] = c.smoothing;
    ctx->saved_data["logits_dtype"] =
        c.logits_dtype ? c10::IValue(static_cast<int64_t>(*c.logits_dtype)) : c10::IValue();
    ctx->saved_data["chunk"] = c.chunk;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->mark_non_differentiable({lse});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::linear_cross_entropy: double backward is not supported (the backward "
                "recomputes the logits); use the aten ops where higher-order gradients are needed");
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), {}, {}};
    auto s = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const c10::IValue ld = ctx->saved_data["logits_dtype"];
    std::optional<at::ScalarType> logits_dtype;
    if (!ld.isNone()) logits_dtype = static_cast<at::ScalarType>(ld.toInt());
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::linear_cross_entropy_backward", "")
                         .typed<decltype(backward_impl)>();
    auto [gh, gw, gb] = op.call(
        g, s[0], s[1], has_bias ? std::optional<at::Tensor>(s[2]) : std::nullopt, s[3], s[4],
        ctx->saved_data["reduction"].toInt(), ctx->saved_data["ignore_index"].toInt(),
        ctx->saved_data["smoothing"].toDouble(), logits_dtype, ctx->saved_data["chunk"].toInt(),
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2)});
    return {gh, gw, gb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor lce_autograd(const at::Tensor& input, const at::Tensor& w,
                        const std::optional<at::Tensor>& bias, const at::Tensor& target,
                        int64_t reduction, int64_t ignore_index, double smoothing,
                        std::optional<at::ScalarType> logits_dtype, int64_t chunk) {
  const LceCall c = make_call(reduction, ignore_index, smoothing, logits_dtype, chunk);
  const at::Tensor b = or_empty(bias);
  const bool grad = at::GradMode::is_enabled() && (input.requires_grad() || w.requires_grad() ||
                                                   (b.defined() && b.requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return std::get<0>(call_forward(input, w, b, target, c));
  }
  return LceFunction::apply(input, w, b.defined() ? b : at::empty({0}, input.options()), target, c,
                            b.defined());
}

at::Tensor lce_plain(const at::Tensor& input, const at::Tensor& w,
                     const std::optional<at::Tensor>& bias, const at::Tensor& target,
                     int64_t reduction, int64_t ignore_index, double smoothing,
                     std::optional<at::ScalarType> logits_dtype, int64_t chunk) {
  return std::get<0>(
      call_forward(input, w, or_empty(bias), target,
                   make_call(reduction, ignore_index, smoothing, logits_dtype, chunk)));
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) { m.impl("linear_cross_entropy", TORCH_FN(lce_autograd)); }

TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("linear_cross_entropy", TORCH_FN(lce_plain));
  m.impl("linear_cross_entropy_forward", TORCH_FN(forward_impl));
  m.impl("linear_cross_entropy_backward", TORCH_FN(backward_impl));
}

TORCH_LIBRARY_IMPL(memslim, Meta, m) {
  m.impl("linear_cross_entropy_forward", TORCH_FN(forward_meta));
  m.impl("linear_cross_entropy_backward", TORCH_FN(backward_meta));
}

} // namespace memslim
