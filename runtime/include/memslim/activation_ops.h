//===- activation_ops.h - device-generic op implementations ----------------===//
//
// What: the forward / backward implementations shared by the CPU and CUDA
// registrations, parameterised by a table of launchers, and the per-op kernel
// set (backend, Meta, Autograd) generated from each op's spec function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

#include "memslim/activation_spec.h"
#include "memslim/kernels/launch.h"

namespace memslim {

struct Launchers {
  void (*forward)(kernels::Act, kernels::DType, const kernels::ForwardArgs&);
  void (*backward)(kernels::Act, kernels::DType, const kernels::BackwardArgs&);
  void (*fixup)(kernels::Act, kernels::DType, const kernels::FixupArgs&);
};

// The kernels library's dtype for a tensor dtype (float, double, half,
// bfloat16; anything else is an error).
kernels::DType to_kernel_dtype(at::ScalarType t);

const Launchers& cpu_launchers();
#ifdef MEMSLIM_WITH_CUDA
const Launchers& cuda_launchers();
// activation_plain on the tensor's CUDA device (sets the device guard).
at::Tensor activation_plain_cuda(const at::Tensor& x, const ActSpec& spec);
#endif

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> activation_forward_impl(
    const at::Tensor& self, c10::string_view act, at::ArrayRef<double> params, bool save,
    const Launchers& L);

at::Tensor activation_backward_impl(const at::Tensor& grad, const std::optional<at::Tensor>& out,
                                    const at::Tensor& bits, const at::Tensor& exact_idx,
                                    const at::Tensor& exact_val, c10::string_view act,
                                    at::ArrayRef<double> params, const Launchers& L);

// Forward only (nothing saved): what a public op runs below autograd.
at::Tensor activation_plain(const at::Tensor& x, const ActSpec& spec, const Launchers& L);

// The Autograd kernel body: saves less when x requires grad, else redispatches.
at::Tensor activation_with_autograd(const at::Tensor& x, const ActSpec& spec);

at::Tensor activation_meta(const at::Tensor& x, const ActSpec& spec);

// Shared by the autograd functions (activation_autograd.cpp, activation_dropout.cpp):
// memslim::activation_forward through the dispatcher (so fake tensors trace it)...
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_activation_forward(
    const at::Tensor& x, const ActSpec& spec, bool save);
// ...and memslim::activation_backward, with `grad` first given `like`'s layout
// (the layout bits and exact indices refer to) and undefined saved tensors
// (an op that keeps no bits or exact list) passed as empty ones.
// Sizes and strides are SymInts: symbolic under torch.compile's dynamic shapes;
// empty ones say `grad` already has the layout (y was contiguous, grad made so).
at::Tensor call_activation_backward(at::Tensor grad, c10::SymIntArrayRef sizes,
                                    c10::SymIntArrayRef strides, const at::Tensor& out,
                                    const at::Tensor& bits, const at::Tensor& exact_idx,
                                    const at::Tensor& exact_val, const std::string& act,
                                    const std::vector<double>& params);

// Kernel set of one public op, from its spec function ActSpec F(args...).
template <auto F>
struct OpKernels;
template <typename... A, ActSpec (*F)(A...)>
struct OpKernels<F> {
  static at::Tensor cpu(const at::Tensor& x, A... a) {
    return activation_plain(x, F(a...), cpu_launchers());
  }
#ifdef MEMSLIM_WITH_CUDA
  static at::Tensor cuda(const at::Tensor& x, A... a) { return activation_plain_cuda(x, F(a...)); }
#endif
  static at::Tensor meta(const at::Tensor& x, A... a) { return activation_meta(x, F(a...)); }
  static at::Tensor autograd(const at::Tensor& x, A... a) {
    return activation_with_autograd(x, F(a...));
  }
};

// Spec functions of the public ops (argument lists as in the schemas): op
// `name` of activation_table.def is registered with spec_name's OpKernels.
inline ActSpec spec_silu() { return spec_simple("silu"); }
inline ActSpec spec_mish() { return spec_simple("mish"); }
inline ActSpec spec_hardswish() { return spec_simple("hardswish"); }
inline ActSpec spec_hardsigmoid() { return spec_simple("hardsigmoid"); }
inline ActSpec spec_sigmoid() { return spec_simple("sigmoid"); }
inline ActSpec spec_tanh() { return spec_simple("tanh"); }
inline ActSpec spec_relu() { return spec_simple("relu"); }

} // namespace memslim
