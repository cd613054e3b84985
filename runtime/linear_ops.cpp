//===- linear_ops.cpp - aten's linear whose backward skips a zero gradient -===//
//
// What: memslim::linear(input, weight, bias): aten::linear's forward, and a
// backward that spends no matmul on an undefined or all-zero incoming
// gradient. fuse-loss-head puts it in place of a loss head's linear whose
// logits the graph also returns (transformers' outputs do): the loss op
// (memslim::linear_cross_entropy with `logits`) reads those logits and
// computes the loss's own gradients, so the linear's backward sees only the
// logits' other readers' gradient, which is undefined in eager autograd when
// nobody uses the returned logits and, under torch.compile, a zero tensor
// AOTAutograd materialises for the unused output (measured: aten's linear
// backward then ran two head-sized matmuls on zeros every step).
// The backward is an internal op (linear_backward: CompositeExplicitAutograd
// over aten ops, and Meta), opaque to torch.compile's partitioner; it scans
// the gradient (one read, early exit at the first nonzero) and returns zeros
// when it is all zero. A create_graph backward runs aten's ops with grad, so
// double backward works.
// Why: the two matmuls on a zero gradient cost ~2/3 of the head's step.
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "memslim/plain_cpu.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether the `n` words of `p` (each an element of `bytes` bytes) are all +-0:
// every bit but the sign clear. Parallel blocks; one found nonzero stops the rest.
template <typename W>
bool words_zero(const W* p, int64_t n) {
  constexpr W mask = static_cast<W>(~(W(1) << (sizeof(W) * 8 - 1)));
  std::atomic<bool> nonzero{false};
  at::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e && !nonzero.load(std::memory_order_relaxed); s += 4096) {
      const int64_t t = std::min<int64_t>(e, s + 4096);
      W acc = 0;
      for (int64_t i = s; i < t; ++i) acc |= p[i] & mask;
      if (acc) nonzero.store(true, std::memory_order_relaxed);
    }
  });
  return !nonzero.load();
}

// Whether `g` is known to be all zero (a real contiguous floating tensor whose
// values are all +-0; NaN is not zero). Anything else counts as nonzero.
bool all_zero(const at::Tensor& g) {
  if (!real_data(g) || !g.device().is_cpu() || !g.is_contiguous() || g.numel() == 0) return false;
  switch (g.scalar_type()) {
    case at::kFloat:
      return words_zero(static_cast<const uint32_t*>(g.const_data_ptr()), g.numel());
    case at::kDouble:
      return words_zero(static_cast<const uint64_t*>(g.const_data_ptr()), g.numel());
    case at::kBFloat16:
    case at::kHalf:
      return words_zero(static_cast<const uint16_t*>(g.const_data_ptr()), g.numel());
    default:
      return false;
  }
}

std::optional<at::Tensor> bias_opt(const at::Tensor& b) {
  return b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
}

// aten's linear backward: the input's, weight's and bias's gradients as
// `mask` asks, with the gradient flattened to [rows, out].
std::tuple<at::Tensor, at::Tensor, at::Tensor> aten_linear_backward(const at::Tensor& grad,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& w,
                                                                    std::array<bool, 3> mask) {
  at::Tensor gh, gw, gb;
  if (mask[0]) gh = grad.matmul(w);
  if (mask[1] || mask[2]) {
    const at::Tensor g2 = grad.reshape({-1, grad.size(-1)});
    if (mask[1]) gw = g2.t().mm(input.reshape({-1, input.size(-1)}));
    if (mask[2]) gb = g2.sum(0);
  }
  return {gh, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_impl(const at::Tensor& grad,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& w,
                                                                    std::array<bool, 3> mask) {
  if (all_zero(grad))
    return {mask[0] ? at::zeros_like(input) : at::Tensor(),
            mask[1] ? at::zeros_like(w) : at::Tensor(),
            mask[2] ? at::zeros({w.size(0)}, w.options()) : at::Tensor()};
  return aten_linear_backward(grad, input, w, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_meta(const at::Tensor& grad,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& w,
                                                                    std::array<bool, 3> mask) {
  return {mask[0] ? at::empty_like(input) : at::Tensor(),
          mask[1] ? at::empty_like(w) : at::Tensor(),
          mask[2] ? at::empty_symint({w.sym_size(0)}, w.options()) : at::Tensor()};
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& w,
                            const at::Tensor& b_arg, bool has_bias) {
    ctx->set_materialize_grads(false); // an unused output's gradient stays undefined
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = at::linear(input, w, has_bias ? bias_opt(b_arg) : std::nullopt);
    }
    ctx->save_for_backward({input, w});
    ctx->saved_data["has_bias"] = has_bias;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out{at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    auto s = ctx->get_saved_variables();
    const std::array<bool, 3> mask{
        ctx->needs_input_grad(0), ctx->needs_input_grad(1),
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)};
    at::Tensor gh, gw, gb;
    if (at::GradMode::is_enabled()) { // create_graph: differentiable aten ops
      std::tie(gh, gw, gb) = aten_linear_backward(g, s[0], s[1], mask);
    } else {
      static auto op = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("memslim::linear_backward", "")
                           .typed<decltype(linear_backward_impl)>();
      std::tie(gh, gw, gb) = op.call(g, s[0], s[1], mask);
    }
    return {gh, gw, gb, at::Tensor()};
  }
};

at::Tensor linear_plain(const at::Tensor& input, const at::Tensor& w,
                        const std::optional<at::Tensor>& b) {
  return at::linear(input, w, b);
}

at::Tensor linear_autograd(const at::Tensor& input, const at::Tensor& w,
                           const std::optional<at::Tensor>& b) {
  const bool has_bias = b && b->defined();
  const bool grad = input.requires_grad() || w.requires_grad() || (has_bias && b->requires_grad());
  if (!at::GradMode::is_enabled() || !grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return at::linear(input, w, b);
  }
  return LinearFunction::apply(input, w, has_bias ? *b : at::empty({0}, input.options()), has_bias);
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) { m.impl("linear", TORCH_FN(linear_autograd)); }

TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("linear", TORCH_FN(linear_plain));
  m.impl("linear_backward", TORCH_FN(linear_backward_impl));
}

TORCH_LIBRARY_IMPL(memslim, Meta, m) { m.impl("linear_backward", TORCH_FN(linear_backward_meta)); }

} // namespace memslim
