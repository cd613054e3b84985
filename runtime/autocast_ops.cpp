//===- autocast_ops.cpp - memslim's matmul ops under torch.autocast --------===//
//
// What: Autocast kernels (CPU and CUDA) of the ops that replace an aten
// linear: gated_linear casts its arguments to autocast's lower precision, as
// aten::linear does; linear_cross_entropy casts the input, weight and bias
// likewise and computes the loss in float32 (logits_dtype defaults to it), as
// autocast runs aten::linear in bf16 / fp16 and cross_entropy in float32.
// Why: torch.compile's graphs and torch.export's are traced above autocast
// (its regions are markers around aten ops); the op that replaces the ops must
// apply autocast's policy itself, or it would run in float32 (slower than the
// model, and not its numerics) or see mixed dtypes and fail.
//
//===----------------------------------------------------------------------===//
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace memslim {
namespace {

template <c10::DeviceType D>
struct Autocast {
  static constexpr c10::DispatchKey key =
      D == c10::DeviceType::CUDA ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU;
  static at::ScalarType dtype() { return at::autocast::get_autocast_dtype(D); }
  static at::Tensor cast(const at::Tensor& t) { return at::autocast::cached_cast(dtype(), t, D); }
  static std::optional<at::Tensor> cast(const std::optional<at::Tensor>& t) {
    return at::autocast::cached_cast(dtype(), t, D);
  }

  static at::Tensor gated_linear(const at::Tensor& g, const at::Tensor& u, const at::Tensor& w,
                                 const std::optional<at::Tensor>& b, c10::string_view act,
                                 at::ArrayRef<double> params) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::gated_linear", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const std::optional<at::Tensor>&, c10::string_view,
                                           at::ArrayRef<double>)>();
    return op.call(cast(g), cast(u), cast(w), cast(b), act, params);
  }

  static at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& w,
                                         const std::optional<at::Tensor>& b,
                                         const at::Tensor& target, int64_t reduction,
                                         int64_t ignore_index, double smoothing,
                                         std::optional<at::ScalarType> logits_dtype, int64_t chunk,
                                         bool grads_in_forward) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("memslim::linear_cross_entropy", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&, const at::Tensor&, int64_t, int64_t,
                              double, std::optional<at::ScalarType>, int64_t, bool)>();
    return op.call(cast(input), cast(w), cast(b), target, reduction, ignore_index, smoothing,
                   logits_dtype.value_or(at::kFloat), chunk, grads_in_forward);
  }
};

} // namespace

TORCH_LIBRARY_IMPL(memslim, AutocastCPU, m) {
  using A = Autocast<c10::DeviceType::CPU>;
  m.impl("gated_linear", TORCH_FN(A::gated_linear));
  m.impl("linear_cross_entropy", TORCH_FN(A::linear_cross_entropy));
}

TORCH_LIBRARY_IMPL(memslim, AutocastCUDA, m) {
  using A = Autocast<c10::DeviceType::CUDA>;
  m.impl("gated_linear", TORCH_FN(A::gated_linear));
  m.impl("linear_cross_entropy", TORCH_FN(A::linear_cross_entropy));
}

} // namespace memslim
