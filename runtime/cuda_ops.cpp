//===- cuda_ops.cpp - CUDA launchers and registrations ---------------------===//
//
// What: binds the kernels/ CUDA launchers to the caller's current stream and
// device, and registers every op for the CUDA key. Built only when the CUDA
// language is enabled; this machine compiles and links it, but has no GPU to
// run it (the CPU tests run the same kernel bodies per thread index).
//
//===----------------------------------------------------------------------===//
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "memslim/activation_ops.h"

namespace memslim {
namespace {

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void cuda_forward(kernels::Act a, kernels::DType t, const kernels::ForwardArgs& args) {
  kernels::forward_cuda(a, t, args, stream());
}
void cuda_backward(kernels::Act a, kernels::DType t, const kernels::BackwardArgs& args) {
  kernels::backward_cuda(a, t, args, stream());
}
void cuda_fixup(kernels::Act a, kernels::DType t, const kernels::FixupArgs& args) {
  kernels::fixup_cuda(a, t, args, stream());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward_cuda(const at::Tensor& self,
                                                                        c10::string_view act,
                                                                        at::ArrayRef<double> params,
                                                                        bool save) {
  c10::cuda::CUDAGuard guard(self.device());
  return activation_forward_impl(self, act, params, save, cuda_launchers());
}
at::Tensor backward_cuda(const at::Tensor& grad, const std::optional<at::Tensor>& out,
                         const at::Tensor& bits, const at::Tensor& idx, const at::Tensor& val,
                         c10::string_view act, at::ArrayRef<double> params) {
  c10::cuda::CUDAGuard guard(grad.device());
  return activation_backward_impl(grad, out, bits, idx, val, act, params, cuda_launchers());
}

} // namespace

const Launchers& cuda_launchers() {
  static const Launchers L{cuda_forward, cuda_backward, cuda_fixup};
  return L;
}

at::Tensor activation_plain_cuda(const at::Tensor& x, const ActSpec& spec) {
  c10::cuda::CUDAGuard guard(x.device());
  return activation_plain(x, spec, cuda_launchers());
}

TORCH_LIBRARY_IMPL(memslim, CUDA, m) {
#define MEMSLIM_OP(NAME, ...) m.impl(#NAME, TORCH_FN(OpKernels<::memslim::spec_##NAME>::cuda));
#include "memslim/kernels/activation_table.def"
  m.impl("activation_forward", TORCH_FN(forward_cuda));
  m.impl("activation_backward", TORCH_FN(backward_cuda));
}

} // namespace memslim
