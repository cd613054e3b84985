//===- pool_ops.cpp - max-pooling that keeps only where each maximum was ---===//
//
// What: memslim::max_pool2d (aten::max_pool2d's signature). The forward is
// aten's max_pool2d_with_indices. The Autograd kernel keeps, per output
// element, the position of its maximum inside its window (int8 for windows of
// up to 127 elements, else int16) and the input's sizes, not the input and
// int64 plane indices aten keeps. Backward rebuilds aten's plane indices from
// the window positions (integer arithmetic, exact) and runs aten's own
// max_pool2d_with_indices_backward, which reads only the indices and the
// input's shape: the gradient is aten's, bit for bit, on every device.
// Why: ResNet's stem max-pool keeps the ReLU's output (aten's backward reads
// it for nothing but its shape) plus 8 bytes per output element: 2.5 bytes
// per input element in fp32 where 1/4 byte per input element determines the
// gradient. Freed, the ReLU before it keeps a 1-bit mask (output-saving).
// Double backward is not supported (a create_graph backward raises).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// aten's argument conventions: one value for both dims, empty stride = kernel.
struct Pool2d {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};
Pool2d pool_of(at::IntArrayRef k, at::IntArrayRef s, at::IntArrayRef p, at::IntArrayRef d) {
  auto two = [](at::IntArrayRef v, size_t i, int64_t fallback) {
    return v.empty() ? fallback : v[v.size() == 1 ? 0 : i];
  };
  TORCH_CHECK(!k.empty() && k.size() <= 2,
              "memslim::max_pool2d: kernel_size must have 1 or 2 "
              "elements");
  Pool2d r;
  r.kh = two(k, 0, 1), r.kw = two(k, 1, 1);
  r.sh = two(s, 0, r.kh), r.sw = two(s, 1, r.kw);
  r.ph = two(p, 0, 0), r.pw = two(p, 1, 0);
  r.dh = two(d, 0, 1), r.dw = two(d, 1, 1);
  return r;
}

// The window origin of each output row / column, broadcastable against the
// (..., OH, OW) indices.
std::pair<at::Tensor, at::Tensor> origins(const at::Tensor& idx, const Pool2d& q) {
  const auto opts = idx.options().dtype(at::kLong);
  const at::Tensor oh =
      at::arange(c10::Scalar(idx.sym_size(-2)), opts).mul_(q.sh).sub_(q.ph).unsqueeze(1);
  const at::Tensor ow = at::arange(c10::Scalar(idx.sym_size(-1)), opts).mul_(q.sw).sub_(q.pw);
  return {oh, ow};
}

// The input plane's index of each window position pos (in [0, kh kw)):
// idx = (oh + (pos / kw) dh) W + ow + (pos % kw) dw, the window origins' plane index
// plus a per-position offset looked up in a table of kh kw entries.
at::Tensor index_of(const at::Tensor& pos, const Pool2d& q, const c10::Scalar& w_in) {
  auto [oh, ow] = origins(pos, q);
  const at::Tensor slot = at::arange(q.kh * q.kw, pos.options());
  const at::Tensor offset =
      slot.div(q.kw, "floor").mul_(q.dh).mul_(w_in).add_(slot.remainder(q.kw).mul_(q.dw));
  return at::take(offset, pos).add_(oh.mul(w_in) + ow);
}

struct MaxPool2dFunction : public torch::autograd::Function<MaxPool2dFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IntArrayRef k,
                            at::IntArrayRef s, at::IntArrayRef p, at::IntArrayRef d, bool ceil) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, idx] = at::max_pool2d_with_indices(x, k, s, p, d, ceil);
    const Pool2d q = pool_of(k, s, p, d);
    const c10::Scalar w_in(x.sym_size(-1));
    auto [oh, ow] = origins(idx, q);
    // Window position: ((ih - oh) / dh) * kw + (iw - ow) / dw, all exact. Without
    // dilation that is idx + ih (kw - W) - (oh kw + ow): one integer division.
    const at::Tensor ih = idx.div(w_in, "floor");
    at::Tensor pos;
    if (q.dh == 1 && q.dw == 1) {
      pos = idx.add(ih, c10::Scalar(q.kw - x.sym_size(-1))).sub_(oh * q.kw + ow);
    } else {
      const at::Tensor iw = idx - ih * w_in;
      pos = (ih - oh).div_(q.dh, "floor").mul_(q.kw).add_((iw - ow).div_(q.dw, "floor"));
    }
    // aten's channels-last CUDA kernel gives index 0 to a window that holds only -inf
    // (its mask starts at 0, not at the window's first element): a position outside
    // the window is kept as -1 and given back as index 0, as aten's backward reads it.
    // Any index the window cannot give back is kept so (the check is a round trip).
    // (Off the CPU only: aten's CPU kernel never gives such an index.)
    if (!x.is_cpu())
      pos = pos.masked_fill(index_of(pos.clamp(0, q.kh * q.kw - 1), q, w_in).ne(idx), -1);
    const auto small = q.kh * q.kw <= 127 ? at::kChar : at::kShort;
    ctx->save_for_backward({pos.to(small)});
    ctx->saved_data["sizes"] = x.sym_sizes().vec();
    ctx->saved_data["format"] = static_cast<int64_t>(x.suggest_memory_format());
    ctx->saved_data["k"] = k.vec();
    ctx->saved_data["s"] = s.vec();
    ctx->saved_data["p"] = p.vec();
    ctx->saved_data["d"] = d.vec();
    ctx->saved_data["ceil"] = ceil;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::max_pool2d: double backward is not supported; use aten::max_pool2d "
                "where higher-order gradients are needed");
    const variable_list none(6);
    if (!grads[0].defined()) return none;
    const at::Tensor pos = ctx->get_saved_variables()[0].to(at::kLong);
    const auto sizes = ctx->saved_data["sizes"].toSymIntVector();
    const auto k = ctx->saved_data["k"].toIntVector(), s = ctx->saved_data["s"].toIntVector(),
               p = ctx->saved_data["p"].toIntVector(), d = ctx->saved_data["d"].toIntVector();
    const Pool2d q = pool_of(k, s, p, d);
    const c10::Scalar w_in(sizes.back());
    const at::Tensor idx = !pos.is_cpu()
                               ? index_of(pos.clamp_min(0), q, w_in).masked_fill_(pos.lt(0), 0)
                               : index_of(pos, q, w_in);
    // aten's backward reads the input for its shape and layout only.
    const at::Tensor shape_only = at::empty_symint(
        sizes, grads[0].options().memory_format(
                   static_cast<at::MemoryFormat>(ctx->saved_data["format"].toInt())));
    variable_list r = none;
    r[0] = at::max_pool2d_with_indices_backward(grads[0], shape_only, k, s, p, d,
                                                ctx->saved_data["ceil"].toBool(), idx);
    return r;
  }
};

at::Tensor max_pool2d_autograd(const at::Tensor& x, at::IntArrayRef k, at::IntArrayRef s,
                               at::IntArrayRef p, at::IntArrayRef d, bool ceil) {
  if (at::GradMode::is_enabled() && x.requires_grad())
    return MaxPool2dFunction::apply(x, k, s, p, d, ceil);
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::max_pool2d(x, k, s, p, d, ceil);
}

at::Tensor max_pool2d_plain(const at::Tensor& x, at::IntArrayRef k, at::IntArrayRef s,
                            at::IntArrayRef p, at::IntArrayRef d, bool ceil) {
  return std::get<0>(at::max_pool2d_with_indices(x, k, s, p, d, ceil));
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) { m.impl("max_pool2d", TORCH_FN(max_pool2d_autograd)); }
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("max_pool2d", TORCH_FN(max_pool2d_plain));
}

} // namespace memslim
