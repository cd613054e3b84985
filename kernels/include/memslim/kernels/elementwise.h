//===- elementwise.h - kernel bodies shared by CPU loops and CUDA kernels --===//
//
// What: the forward, backward and exact-list fix-up bodies of every activation,
// written as host+device functions of (thread index, thread count, params).
// One "group" is 8 consecutive elements = one byte of packed bits, so a thread
// owns whole bytes and never races on a bit; full groups load and store with
// 16-byte vector accesses when every pointer is 16-byte aligned, the tail group
// (n % 8 elements) goes element by element.
// Why: the __global__ wrappers only read blockIdx/threadIdx and call these
// bodies, so a CPU test that calls a body for every thread index of a small
// launch grid checks the exact indexing the GPU runs (no GPU on our machines).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/activations.h"

namespace memslim {
namespace kernels {

// Storage of one group; alignment lets 8 elements move as 16-byte vectors.
template <typename S>
struct alignas(sizeof(S) * 8 < 16 ? sizeof(S) * 8 : 16) Group8 {
  S v[8];
};

template <typename S>
struct ForwardParams {
  const S* x = nullptr;
  S* y = nullptr;
  uint8_t* bits = nullptr; // packed, bit (i % 8) of byte i / 8; null: none
  int64_t n = 0;
  ActParams act;
  bool aligned = false; // x and y 16-byte aligned
  // Exact list (guard band): indices and input values appended in any order.
  int32_t* exact_idx = nullptr; // null: no exact list
  S* exact_val = nullptr;
  unsigned long long* exact_count = nullptr;
  int64_t exact_cap = 0;
};

// Appends element `index` (input value `value`) to the exact list; past its
// capacity only the count grows (the caller reruns with the measured length).
template <typename S>
MEMSLIM_HD void push_exact(const ForwardParams<S>& p, int64_t index, S value) {
  const unsigned long long k = atomic_add(p.exact_count, 1ull);
  if (int64_t(k) < p.exact_cap) {
    p.exact_idx[k] = int32_t(index);
    p.exact_val[k] = value;
  }
}

template <typename S>
struct BackwardParams {
  const S* grad = nullptr;       // dL/dy
  const S* y = nullptr;          // saved output; null for mask-only ops
  const uint8_t* bits = nullptr; // null when the op stores no bit
  S* grad_in = nullptr;          // dL/dx
  int64_t n = 0;
  ActParams act;
  bool aligned = false; // grad, y, grad_in 16-byte aligned
};

template <typename S>
struct FixupParams {
  const int32_t* idx = nullptr;
  const S* val = nullptr; // exact inputs
  const S* grad = nullptr;
  S* grad_in = nullptr;
  int64_t count = 0;
  ActParams act;
};

MEMSLIM_HD int64_t num_groups(int64_t n) { return (n + 7) / 8; }

template <Act A, typename S>
MEMSLIM_HD void forward_group(int64_t g, const ForwardParams<S>& p) {
  using C = typename compute_type<S>::type;
  const int64_t base = g * 8;
  const int cnt = int(p.n - base < 8 ? p.n - base : 8);
  Group8<S> in, out;
  if (cnt == 8 && p.aligned) {
    in = *reinterpret_cast<const Group8<S>*>(p.x + base);
  } else {
    for (int j = 0; j < cnt; ++j) in.v[j] = p.x[base + j];
  }
  uint8_t byte = 0;
  for (int j = 0; j < 8; ++j) {
    if (j >= cnt) break;
    C x = load<C>(in.v[j]);
    const S y = store<S>(ActMath<A>::forward(x, p.act));
    if (p.y) out.v[j] = y;
    if (p.bits && ActMath<A>::bit(x, p.act)) byte |= uint8_t(1u << j);
    // Membership is decided from x and the output as stored.
    if (p.exact_idx && ActMath<A>::exact(x, load<C>(y), p.act)) push_exact(p, base + j, in.v[j]);
  }
  if (p.y) {
    if (cnt == 8 && p.aligned) {
      *reinterpret_cast<Group8<S>*>(p.y + base) = out;
    } else {
      for (int j = 0; j < cnt; ++j) p.y[base + j] = out.v[j];
    }
  }
  if (p.bits) p.bits[g] = byte;
}

template <Act A, typename S>
MEMSLIM_HD void backward_group(int64_t g, const BackwardParams<S>& p) {
  using C = typename compute_type<S>::type;
  const int64_t base = g * 8;
  const int cnt = int(p.n - base < 8 ? p.n - base : 8);
  const bool vec = cnt == 8 && p.aligned;
  Group8<S> gr, yv, out;
  if (vec) {
    gr = *reinterpret_cast<const Group8<S>*>(p.grad + base);
    if (p.y) yv = *reinterpret_cast<const Group8<S>*>(p.y + base);
  } else {
    for (int j = 0; j < cnt; ++j) {
      gr.v[j] = p.grad[base + j];
      if (p.y) yv.v[j] = p.y[base + j];
    }
  }
  const uint8_t byte = p.bits ? p.bits[g] : uint8_t(0);
  for (int j = 0; j < 8; ++j) {
    if (j >= cnt) break;
    C y = p.y ? load<C>(yv.v[j]) : C(0);
    bool b = (byte >> j) & 1u;
    out.v[j] = store<S>(chain<A, C>(load<C>(gr.v[j]), ActMath<A>::grad_from_output(y, b, p.act)));
  }
  if (vec) {
    *reinterpret_cast<Group8<S>*>(p.grad_in + base) = out;
  } else {
    for (int j = 0; j < cnt; ++j) p.grad_in[base + j] = out.v[j];
  }
}

// Exact-list elements: the derivative from the kept input, aten's formula.
template <Act A, typename S>
MEMSLIM_HD void fixup_one(int64_t k, const FixupParams<S>& p) {
  using C = typename compute_type<S>::type;
  const int64_t i = p.idx[k];
  C x = load<C>(p.val[k]);
  p.grad_in[i] = store<S>(chain_from_input<A, C>(load<C>(p.grad[i]), x, p.act));
}

// Grid-stride bodies: what thread `tid` of `nthreads` does.
template <Act A, typename S>
MEMSLIM_HD void forward_body(int64_t tid, int64_t nthreads, const ForwardParams<S>& p) {
  const int64_t ng = num_groups(p.n);
  for (int64_t g = tid; g < ng; g += nthreads) forward_group<A, S>(g, p);
}
template <Act A, typename S>
MEMSLIM_HD void backward_body(int64_t tid, int64_t nthreads, const BackwardParams<S>& p) {
  const int64_t ng = num_groups(p.n);
  for (int64_t g = tid; g < ng; g += nthreads) backward_group<A, S>(g, p);
}
template <Act A, typename S>
MEMSLIM_HD void fixup_body(int64_t tid, int64_t nthreads, const FixupParams<S>& p) {
  for (int64_t k = tid; k < p.count; k += nthreads) fixup_one<A, S>(k, p);
}

} // namespace kernels
} // namespace memslim
