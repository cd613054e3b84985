//===- rotate_half_ops.cpp - RoPE's rotate_half, keeping no tensor ----------===//
//
// What: memslim::rotate_half(x, dim, split) = cat([-x[.., split:], x[.., :split]],
// dim), the slices clamped as aten's slice clamps them (a negative split counts
// from the end), so it is the graph's own four ops for every shape. Its
// backward keeps two integers: the gradient's halves swapped back, the
// moved one negated (g[.., a:] and -g[.., :a] with a = the length of
// x[.., split:]), through aten ops, so a create_graph backward differentiates.
// Why: fuse-rotate-half (core/rotate_half.h) puts it in place of transformers'
// rotate_half in a TorchScript graph: the executor's autodiff does not take an
// unknown op into its DifferentiableGraphs, whose backward kept the cat's list
// (a slice of q / k and neg's output) where eager's CatBackward keeps sizes.
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace memslim {
namespace {

at::Tensor rotate_half_plain(const at::Tensor& x, int64_t dim, c10::SymInt split) {
  return at::cat(
      {at::neg(x.slice_symint(dim, split, std::nullopt)), x.slice_symint(dim, std::nullopt, split)},
      dim);
}

struct RotateHalfFunction : public torch::autograd::Function<RotateHalfFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim,
                            c10::SymInt split) {
    // a: how many elements x[.., split:] has (the moved half's length).
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["a"] = x.slice_symint(dim, split, std::nullopt).sym_size(dim);
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::rotate_half", "")
                         .typed<at::Tensor(const at::Tensor&, int64_t, c10::SymInt)>();
    return op.call(x, dim, split);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const c10::SymInt a = ctx->saved_data["a"].toSymInt();
    // y = [-x[s:], x[:s]] with |x[s:]| = a: dx[:s] = g[a:], dx[s:] = -g[:a].
    at::Tensor gx = at::cat(
        {g.slice_symint(dim, a, std::nullopt), at::neg(g.slice_symint(dim, std::nullopt, a))}, dim);
    return {gx, at::Tensor(), at::Tensor()};
  }
};

at::Tensor rotate_half_autograd(const at::Tensor& x, int64_t dim, c10::SymInt split) {
  return RotateHalfFunction::apply(x, dim, std::move(split));
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("rotate_half", TORCH_FN(rotate_half_plain));
}

TORCH_LIBRARY_IMPL(memslim, Autograd, m) { m.impl("rotate_half", TORCH_FN(rotate_half_autograd)); }

} // namespace memslim
