//===- cuda_kernels.cu - CUDA launchers: grid-stride wrappers of the bodies ===//
//
// What: each __global__ kernel reads only its thread index and grid size and
// calls the host+device body from elementwise.h, which the CPU tests run for
// every thread index of a small grid. One thread owns whole 8-element groups
// (one byte of bits) and moves full groups as 16-byte vectors when aligned;
// a forward thread takes kForwardGroupsPerThread groups per round.
// Launch: 256 threads, enough blocks to cover the groups (the forward's
// rounds) once, at most 65535 blocks (larger tensors loop in the grid-stride
// body). Runs on the caller's stream.
//
//===----------------------------------------------------------------------===//
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

template <Act A, typename S>
__global__ void forward_kernel(ForwardParams<S> p) {
  forward_body<A, S>(int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                     int64_t(gridDim.x) * blockDim.x, p);
}
template <Act A, typename S>
__global__ void backward_kernel(BackwardParams<S> p) {
  backward_body<A, S>(int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                      int64_t(gridDim.x) * blockDim.x, p);
}
template <Act A, typename S>
__global__ void fixup_kernel(FixupParams<S> p) {
  fixup_body<A, S>(int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x,
                   p);
}

int blocks_for(int64_t work) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return int(b < kMaxBlocks ? b : kMaxBlocks);
}

void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("memslim: CUDA launch of ") + what +
                             " failed: " + cudaGetErrorString(err));
}

struct ForwardLaunch {
  template <Act A, typename S>
  static void run(const ForwardArgs& a, cudaStream_t s) {
    forward_kernel<A, S><<<blocks_for(forward_threads(a.n)), kThreads, 0, s>>>(typed<S>(a));
    check_launch("forward");
  }
};
struct BackwardLaunch {
  template <Act A, typename S>
  static void run(const BackwardArgs& a, cudaStream_t s) {
    backward_kernel<A, S><<<blocks_for(groups_for(a.n)), kThreads, 0, s>>>(typed<S>(a));
    check_launch("backward");
  }
};
struct FixupLaunch {
  template <Act A, typename S>
  static void run(const FixupArgs& a, cudaStream_t s) {
    fixup_kernel<A, S><<<blocks_for(a.count), kThreads, 0, s>>>(typed<S>(a));
    check_launch("fixup");
  }
};

} // namespace

void forward_cuda(Act a, DType t, const ForwardArgs& args, cudaStream_t s) {
  if (args.n == 0) return;
  dispatch<ForwardLaunch>(a, t, args, s);
}
void backward_cuda(Act a, DType t, const BackwardArgs& args, cudaStream_t s) {
  if (args.n == 0) return;
  dispatch<BackwardLaunch>(a, t, args, s);
}
void fixup_cuda(Act a, DType t, const FixupArgs& args, cudaStream_t s) {
  if (args.count == 0) return;
  dispatch<FixupLaunch>(a, t, args, s);
}

} // namespace kernels
} // namespace memslim
