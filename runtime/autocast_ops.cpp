//===- autocast_ops.cpp - memslim's matmul ops under torch.autocast --------===//
//
// What: Autocast kernels (CPU and CUDA) of the ops that replace an aten
// linear or conv: gated_linear casts its arguments to autocast's lower
// precision, as aten::linear does; linear_cross_entropy casts the input, weight
// and bias likewise and computes the loss in float32 (logits_dtype defaults to
// it), as autocast runs aten::linear in bf16 / fp16 and cross_entropy in
// float32; act_linear / act_conv*d cast the weight and bias and pass h as the
// model made it: the op computes act(h) in h's dtype (autocast leaves
// activations alone; CUDA's runs softplus in float32, so h is cast to float32
// there first) and casts act(h) to the weight's dtype, which is autocast's cast
// of the linear / conv input, recomputed in backward instead of kept.
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
                                         bool grads_in_forward,
                                         const std::optional<at::Tensor>& logits) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::linear_cross_entropy", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                           const std::optional<at::Tensor>&, const at::Tensor&,
                                           int64_t, int64_t, double, std::optional<at::ScalarType>,
                                           int64_t, bool, const std::optional<at::Tensor>&)>();
    // given logits are the linear's output under autocast: already 16-bit
    return op.call(cast(input), cast(w), cast(b), target, reduction, ignore_index, smoothing,
                   logits_dtype.value_or(at::kFloat), chunk, grads_in_forward, logits);
  }

  static at::Tensor linear(const at::Tensor& input, const at::Tensor& w,
                           const std::optional<at::Tensor>& b) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::linear", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                           const std::optional<at::Tensor>&)>();
    return op.call(cast(input), cast(w), cast(b));
  }

  // h for an act_<consumer>: as the model made it, in float32 where the device's
  // autocast runs the activation in float32 (CUDA: softplus). A float64 h is
  // left alone by autocast, and aten's linear / conv would then meet a weight
  // of another dtype: the same error here.
  static at::Tensor act_input(const at::Tensor& h, c10::string_view act, const at::Tensor& w) {
    const at::Tensor x = D == c10::DeviceType::CUDA && act == "softplus"
                             ? at::autocast::cached_cast(at::kFloat, h, D)
                             : h;
    TORCH_CHECK(!x.is_floating_point() || at::autocast::is_eligible(x, D) ||
                    x.scalar_type() == w.scalar_type(),
                "memslim::act_*: under autocast, an input of dtype ", x.scalar_type(),
                " meets a weight of dtype ", w.scalar_type(),
                " (autocast casts neither); aten's linear / conv raises the same");
    return x;
  }

  static at::Tensor act_linear(const at::Tensor& h, const at::Tensor& w,
                               const std::optional<at::Tensor>& b, c10::string_view act,
                               at::ArrayRef<double> params) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("memslim::act_linear", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                           const std::optional<at::Tensor>&, c10::string_view,
                                           at::ArrayRef<double>)>();
    const at::Tensor cw = cast(w);
    return op.call(act_input(h, act, cw), cw, cast(b), act, params);
  }

  template <int Spatial>
  static at::Tensor act_conv(const at::Tensor& h, const at::Tensor& w,
                             const std::optional<at::Tensor>& b, c10::SymIntArrayRef stride,
                             c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                             c10::SymInt groups, c10::string_view act,
                             at::ArrayRef<double> params) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    static const std::string name = "memslim::act_conv" + std::to_string(Spatial) + "d";
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow(name.c_str(), "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                           const std::optional<at::Tensor>&, c10::SymIntArrayRef,
                                           c10::SymIntArrayRef, c10::SymIntArrayRef, c10::SymInt,
                                           c10::string_view, at::ArrayRef<double>)>();
    const at::Tensor cw = cast(w);
    return op.call(act_input(h, act, cw), cw, cast(b), stride, padding, dilation, std::move(groups),
                   act, params);
  }
};

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  using A = Autocast<D>;
  m.impl("gated_linear", TORCH_FN(A::gated_linear));
  m.impl("linear_cross_entropy", TORCH_FN(A::linear_cross_entropy));
  m.impl("linear", TORCH_FN(A::linear));
  m.impl("act_linear", TORCH_FN(A::act_linear));
  m.impl("act_conv1d", TORCH_FN(A::template act_conv<1>));
  m.impl("act_conv2d", TORCH_FN(A::template act_conv<2>));
  m.impl("act_conv3d", TORCH_FN(A::template act_conv<3>));
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, AutocastCPU, m) { register_autocast<c10::DeviceType::CPU>(m); }

TORCH_LIBRARY_IMPL(memslim, AutocastCUDA, m) { register_autocast<c10::DeviceType::CUDA>(m); }

} // namespace memslim
