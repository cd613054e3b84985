//===- activation_ops.cpp - forward/backward impls, CPU and Meta kernels ----===//
//
// What: the device-generic bodies of the internal activation_forward /
// activation_backward ops and of the public ops' plain forward, the CPU
// launchers (kernels/ bodies spread over at::parallel_for), and the CPU and
// Meta registrations.
// Layout: any non-overlapping dense tensor (contiguous, channels_last, other
// permutations) is processed in memory order without a copy; bits and exact
// indices refer to that order, and backward receives grad in the same layout
// (the Autograd kernel conforms it). Other inputs are first copied to the dense
// layout with their stride order (as aten's TensorIterator lays out its output).
//
//===----------------------------------------------------------------------===//
#include "memslim/activation_ops.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <climits>
#include <cstring>

namespace memslim {

using kernels::Act;

kernels::DType to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kernels::DType::Float;
    case at::kDouble:
      return kernels::DType::Double;
    case at::kHalf:
      return kernels::DType::Half;
    case at::kBFloat16:
      return kernels::DType::BFloat16;
    default:
      TORCH_CHECK(false, "memslim: unsupported dtype ", t);
  }
}

namespace {

// Groups per parallel_for task: a group is 8 elements, so 512 groups = 4096
// elements, enough work to amortise a task even for relu.
constexpr int64_t kGrainGroups = 512;

void cpu_forward(Act a, kernels::DType t, const kernels::ForwardArgs& args) {
  at::parallel_for(0, kernels::groups_for(args.n), kGrainGroups,
                   [&](int64_t b, int64_t e) { kernels::forward_cpu(a, t, args, b, e); });
}
void cpu_backward(Act a, kernels::DType t, const kernels::BackwardArgs& args) {
  at::parallel_for(0, kernels::groups_for(args.n), kGrainGroups,
                   [&](int64_t b, int64_t e) { kernels::backward_cpu(a, t, args, b, e); });
}
void cpu_fixup(Act a, kernels::DType t, const kernels::FixupArgs& args) {
  at::parallel_for(0, args.count, 4096,
                   [&](int64_t b, int64_t e) { kernels::fixup_cpu(a, t, args, b, e); });
}

// First guess of the exact-list length; the forward reruns with the measured
// length when it was too small. 16-bit bands are wide (see guard_band).
int64_t exact_capacity_guess(int64_t n, at::ScalarType t) {
  const bool narrow = t == at::kHalf || t == at::kBFloat16;
  return (narrow ? n / 4 : n / 64) + 64;
}

} // namespace

const Launchers& cpu_launchers() {
  static const Launchers L{cpu_forward, cpu_backward, cpu_fixup};
  return L;
}

namespace {

// The forward; bits / exact list undefined where not kept (save false, or an
// activation without them): the public ops' plain forward allocates nothing
// else per call (issue 13's per-call overhead), the op fills in empty ones.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_forward(const at::Tensor& self,
                                                                       c10::string_view act_sv,
                                                                       at::ArrayRef<double> params,
                                                                       bool save,
                                                                       const Launchers& L) {
  const std::string act(act_sv);
  const Act a = act_from_name(act);
  check_dtype(self, act);
  // Other inputs are copied to the dense layout aten's TensorIterator gives its
  // output (empty_like: the input's stride order), so y has aten's strides and a
  // dropout drawn over y's layout draws aten's mask (long-fuzz seed 124836: a
  // transposed slice made contiguous drew each element's keep bit elsewhere).
  at::Tensor x = self;
  if (!self.is_non_overlapping_and_dense()) {
    x = at::empty_like(self);
    x.copy_(self);
  }
  at::Tensor y = at::empty_like(x);
  const kernels::ActParams p = make_params(a, params.vec(), x.scalar_type());
  const int64_t n = x.numel();
  const auto opts = x.options();
  const bool want_bits = save && p.bits;
  const bool want_exact = save && kernels::act_has_exact_list(a, p);
  at::Tensor bits, idx, val;
  if (want_bits) bits = at::empty({kernels::groups_for(n)}, opts.dtype(at::kByte));
  if (n == 0) return {y, bits, idx, val};

  kernels::ForwardArgs args;
  args.x = x.const_data_ptr();
  args.y = y.mutable_data_ptr();
  args.bits = want_bits ? bits.mutable_data_ptr<uint8_t>() : nullptr;
  args.n = n;
  args.act = p;
  const kernels::DType dt = to_kernel_dtype(x.scalar_type());
  if (!want_exact) {
    L.forward(a, dt, args);
    return {y, bits, idx, val};
  }
  TORCH_CHECK(n <= INT32_MAX, "memslim::", act,
              ": tensors over 2^31-1 elements are not "
              "supported yet (exact-list indices are int32)");
  int64_t cap = exact_capacity_guess(n, x.scalar_type());
  // On the CPU the count lives on the stack and the list is copied to its
  // exact size by memcpy: no dispatcher round trips per call (issue 13's
  // per-call overhead); on a device, a device counter read back once.
  const bool cpu = x.is_cpu();
  for (;;) {
    idx = at::empty({cap}, opts.dtype(at::kInt));
    val = at::empty({cap}, opts);
    unsigned long long host_count = 0;
    at::Tensor count;
    if (cpu) {
      args.exact_count = &host_count;
    } else {
      count = at::zeros({1}, opts.dtype(at::kLong));
      args.exact_count = reinterpret_cast<unsigned long long*>(count.mutable_data_ptr<int64_t>());
    }
    args.exact_idx = idx.mutable_data_ptr<int32_t>();
    args.exact_val = val.mutable_data_ptr();
    args.exact_cap = cap;
    L.forward(a, dt, args);
    const int64_t c = cpu ? int64_t(host_count) : count.item<int64_t>();
    if (c <= cap) {
      // Copy to exact size so the saved storages hold only what is needed.
      if (c < cap && cpu) {
        at::Tensor i2 = at::empty({c}, opts.dtype(at::kInt)), v2 = at::empty({c}, opts);
        std::memcpy(i2.mutable_data_ptr(), idx.const_data_ptr(), size_t(c) * sizeof(int32_t));
        std::memcpy(v2.mutable_data_ptr(), val.const_data_ptr(), size_t(c) * val.element_size());
        idx = i2;
        val = v2;
      } else if (c < cap) {
        idx = idx.narrow(0, 0, c).clone();
        val = val.narrow(0, 0, c).clone();
      }
      break;
    }
    cap = c; // too small: rerun with the measured length
  }
  return {y, bits, idx, val};
}

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> activation_forward_impl(
    const at::Tensor& self, c10::string_view act, at::ArrayRef<double> params, bool save,
    const Launchers& L) {
  auto [y, bits, idx, val] = run_forward(self, act, params, save, L);
  const auto opts = y.options();
  if (!bits.defined()) bits = at::empty({0}, opts.dtype(at::kByte));
  if (!idx.defined()) idx = at::empty({0}, opts.dtype(at::kInt));
  if (!val.defined()) val = at::empty({0}, opts);
  return {y, bits, idx, val};
}

at::Tensor activation_backward_impl(const at::Tensor& grad, const std::optional<at::Tensor>& out,
                                    const at::Tensor& bits, const at::Tensor& exact_idx,
                                    const at::Tensor& exact_val, c10::string_view act_sv,
                                    at::ArrayRef<double> params, const Launchers& L) {
  const std::string act(act_sv);
  const Act a = act_from_name(act);
  check_dtype(grad, act);
  const kernels::ActParams p = make_params(a, params.vec(), grad.scalar_type());
  const int64_t n = grad.numel();
  TORCH_CHECK(grad.is_non_overlapping_and_dense(),
              "memslim::activation_backward: grad must be dense");
  const bool has_out = out.has_value() && out->defined();
  const bool mask = kernels::save_kind(a) == kernels::SaveKind::Mask;
  TORCH_CHECK(mask || has_out, "memslim::activation_backward: '", act, "' needs the saved output");
  if (has_out) {
    TORCH_CHECK(out->sizes() == grad.sizes() && out->strides() == grad.strides() &&
                    out->scalar_type() == grad.scalar_type(),
                "memslim::activation_backward: grad and saved output differ in layout or dtype");
  }
  TORCH_CHECK(!p.bits || bits.numel() == kernels::groups_for(n),
              "memslim::activation_backward: expected ", kernels::groups_for(n),
              " bytes of bits, got ", bits.numel());
  TORCH_CHECK(exact_idx.numel() == exact_val.numel(),
              "memslim::activation_backward: exact list index/value lengths differ");
  at::Tensor gi = at::empty_like(grad);
  if (n == 0) return gi;
  const kernels::DType dt = to_kernel_dtype(grad.scalar_type());
  kernels::BackwardArgs args;
  args.grad = grad.const_data_ptr();
  args.y = has_out ? out->const_data_ptr() : nullptr;
  args.bits = p.bits ? bits.const_data_ptr<uint8_t>() : nullptr;
  args.grad_in = gi.mutable_data_ptr();
  args.n = n;
  args.act = p;
  L.backward(a, dt, args);
  if (exact_idx.numel() > 0) {
    TORCH_CHECK(
        exact_idx.scalar_type() == at::kInt && exact_val.scalar_type() == grad.scalar_type(),
        "memslim::activation_backward: exact list has the wrong dtype");
    kernels::FixupArgs f;
    const at::Tensor ei = exact_idx.contiguous(), ev = exact_val.contiguous();
    f.idx = ei.const_data_ptr<int32_t>();
    f.val = ev.const_data_ptr();
    f.grad = grad.const_data_ptr();
    f.grad_in = gi.mutable_data_ptr();
    f.count = ei.numel();
    f.act = p;
    L.fixup(a, dt, f);
  }
  return gi;
}

at::Tensor activation_plain(const at::Tensor& x, const ActSpec& spec, const Launchers& L) {
  check_dtype(x, spec.op);
  return std::get<0>(run_forward(x, spec.act, spec.params, false, L));
}

at::Tensor activation_meta(const at::Tensor& x, const ActSpec& spec) {
  check_dtype(x, spec.op);
  return at::empty_like(x);
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward_cpu(const at::Tensor& self,
                                                                       c10::string_view act,
                                                                       at::ArrayRef<double> params,
                                                                       bool save) {
  return activation_forward_impl(self, act, params, save, cpu_launchers());
}
at::Tensor backward_cpu(const at::Tensor& grad, const std::optional<at::Tensor>& out,
                        const at::Tensor& bits, const at::Tensor& idx, const at::Tensor& val,
                        c10::string_view act, at::ArrayRef<double> params) {
  return activation_backward_impl(grad, out, bits, idx, val, act, params, cpu_launchers());
}
at::Tensor backward_meta(const at::Tensor& grad, const std::optional<at::Tensor>& out,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         c10::string_view act, at::ArrayRef<double>) {
  check_dtype(grad, std::string(act));
  if (out.has_value() && out->defined())
    TORCH_CHECK(out->sym_sizes() == grad.sym_sizes(),
                "memslim::activation_backward: size mismatch");
  return at::empty_like(grad);
}

// Calls spec function F with IValue arguments converted to its parameter types.
template <auto F>
struct SpecCall;
template <typename... A, ActSpec (*F)(A...)>
struct SpecCall<F> {
  // By value (a `const Scalar&` parameter binds to the returned temporary,
  // which lives until F returns; a string_view points into `v`).
  template <typename T>
  static std::decay_t<T> arg(const c10::IValue& v) {
    using D = std::decay_t<T>;
    if constexpr (std::is_same_v<D, c10::string_view>)
      return c10::string_view(v.toStringRef());
    else
      return v.to<D>();
  }
  template <size_t... I>
  static ActSpec call(const std::vector<c10::IValue>& v, std::index_sequence<I...>) {
    return F(arg<A>(v[I])...);
  }
  static std::optional<ActSpec> call(const std::vector<c10::IValue>& v) {
    if (v.size() != sizeof...(A)) return std::nullopt;
    return call(v, std::index_sequence_for<A...>{});
  }
};

} // namespace

std::optional<ActSpec> spec_for(const std::string& op, const std::vector<c10::IValue>& args) {
#define MEMSLIM_OP(NAME, ...) \
  if (op == #NAME) return SpecCall<::memslim::spec_##NAME>::call(args);
#include "memslim/kernels/activation_table.def"
  return std::nullopt;
}

TORCH_LIBRARY_IMPL(memslim, CPU, m) {
#define MEMSLIM_OP(NAME, ...) m.impl(#NAME, TORCH_FN(OpKernels<::memslim::spec_##NAME>::cpu));
#include "memslim/kernels/activation_table.def"
  m.impl("activation_forward", TORCH_FN(forward_cpu));
  m.impl("activation_backward", TORCH_FN(backward_cpu));
}

// activation_forward has no Meta kernel here: its exact list has a
// data-dependent length, which only a fake impl with an unbacked size can
// express (python/memslim registers it with torch.library.register_fake).
TORCH_LIBRARY_IMPL(memslim, Meta, m) {
#define MEMSLIM_OP(NAME, ...) m.impl(#NAME, TORCH_FN(OpKernels<::memslim::spec_##NAME>::meta));
#include "memslim/kernels/activation_table.def"
  m.impl("activation_backward", TORCH_FN(backward_meta));
}

} // namespace memslim

// Anchor referenced by users of the library so the linker keeps it (a library
// holding only static registrations is dropped under --as-needed).
extern "C" int memslim_runtime_anchor() { return 1; }
