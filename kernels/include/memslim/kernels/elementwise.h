//===- elementwise.h - kernel bodies shared by CPU loops and CUDA kernels --===//
//
// What: the forward, backward and exact-list fix-up bodies of every activation,
// written as host+device functions of (thread index, thread count, params).
// One "group" is 8 consecutive elements = one byte of packed bits, so a thread
// owns whole bytes and never races on a bit; full groups load and store with
// 16-byte vector accesses when every pointer is 16-byte aligned, the tail group
// (n % 8 elements) goes element by element. A forward thread takes
// kForwardGroupsPerThread groups per round, one slab of nthreads groups apart
// (a warp's accesses stay contiguous), loads them all before computing, and
// reserves its exact-list slots once per round (reserve_slots: one atomic per
// converged warp on the GPU). Loops over a group's elements are unrolled with
// constant indices so its values stay in registers on the GPU (a dynamically
// indexed Group8 went to local memory).
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

// Groups a forward thread handles per round of its grid-stride loop.
constexpr int kForwardGroupsPerThread = 4;
// Threads that cover the forward over n elements in one round.
MEMSLIM_HD int64_t forward_threads(int64_t n) {
  return (num_groups(n) + kForwardGroupsPerThread - 1) / kForwardGroupsPerThread;
}

MEMSLIM_HD int group_count(int64_t n, int64_t g) {
  const int64_t r = n - g * 8;
  return int(r < 8 ? r : 8);
}

template <typename S>
MEMSLIM_HD void load_group(const S* src, int64_t base, int cnt, bool vec, Group8<S>& g) {
  if (vec) {
    g = *reinterpret_cast<const Group8<S>*>(src + base);
  } else {
    MEMSLIM_UNROLL
    for (int j = 0; j < 8; ++j) // constant indices: `g` stays in registers on the GPU
      if (j < cnt) g.v[j] = src[base + j];
  }
}
template <typename S>
MEMSLIM_HD void store_group(S* dst, int64_t base, int cnt, bool vec, const Group8<S>& g) {
  if (vec) {
    *reinterpret_cast<Group8<S>*>(dst + base) = g;
  } else {
    MEMSLIM_UNROLL
    for (int j = 0; j < 8; ++j)
      if (j < cnt) dst[base + j] = g.v[j];
  }
}

// Outputs of one loaded group; returns its bits byte, sets `exact` to the byte
// of its exact-list members (decided from x and the output as stored).
template <Act A, typename S>
MEMSLIM_HD uint8_t forward_values(const ForwardParams<S>& p, int cnt, const Group8<S>& in,
                                  Group8<S>& out, uint8_t& exact) {
  using C = typename compute_type<S>::type;
  uint8_t byte = 0;
  exact = 0;
  MEMSLIM_UNROLL
  for (int j = 0; j < 8; ++j) {
    if (j >= cnt) break;
    C x = load<C>(in.v[j]);
    const S y = store<S>(ActMath<A>::forward(x, p.act));
    out.v[j] = y;
    if (p.bits && ActMath<A>::bit(x, p.act)) byte |= uint8_t(1u << j);
    if (p.exact_idx && ActMath<A>::exact(x, load<C>(y), p.act)) exact |= uint8_t(1u << j);
  }
  return byte;
}

// Appends the round's exact elements (bit 8u+j of `mask`: element j of group
// g0 + u*nthreads) with one reservation of popcount(mask) slots; past the
// capacity only the count grows (the caller reruns with the measured length).
template <typename S>
MEMSLIM_HD void push_exact_round(const ForwardParams<S>& p, int64_t g0, int64_t nthreads,
                                 uint32_t mask, const Group8<S> (&in)[kForwardGroupsPerThread]) {
  unsigned long long k = reserve_slots(p.exact_count, unsigned(popcount32(mask)));
  if (mask == 0) return;
  MEMSLIM_UNROLL
  for (int u = 0; u < kForwardGroupsPerThread; ++u) {
    MEMSLIM_UNROLL
    for (int j = 0; j < 8; ++j) {
      if (!((mask >> (8 * u + j)) & 1u)) continue;
      if (int64_t(k) < p.exact_cap) {
        p.exact_idx[k] = int32_t((g0 + u * nthreads) * 8 + j);
        p.exact_val[k] = in[u].v[j];
      }
      ++k;
    }
  }
}

// One round of the forward: groups g0 + u*nthreads, u < kForwardGroupsPerThread
// (a warp's lanes hold consecutive groups in each slab, so every load and store
// instruction of a warp covers contiguous memory). All loads are issued before
// any compute; the exact list takes one reservation per round.
template <Act A, typename S>
MEMSLIM_HD void forward_round(int64_t g0, int64_t nthreads, const ForwardParams<S>& p) {
  constexpr int U = kForwardGroupsPerThread;
  const int64_t ng = num_groups(p.n);
  Group8<S> in[U];
  int cnt[U];
  MEMSLIM_UNROLL
  for (int u = 0; u < U; ++u) {
    const int64_t g = g0 + u * nthreads;
    cnt[u] = g < ng ? group_count(p.n, g) : 0;
    if (cnt[u] > 0) load_group(p.x, g * 8, cnt[u], cnt[u] == 8 && p.aligned, in[u]);
  }
  uint32_t exact = 0;
  MEMSLIM_UNROLL
  for (int u = 0; u < U; ++u) {
    if (cnt[u] == 0) continue;
    const int64_t g = g0 + u * nthreads;
    Group8<S> out;
    uint8_t eb = 0;
    const uint8_t byte = forward_values<A, S>(p, cnt[u], in[u], out, eb);
    if (p.y) store_group(p.y, g * 8, cnt[u], cnt[u] == 8 && p.aligned, out);
    if (p.bits) p.bits[g] = byte;
    exact |= uint32_t(eb) << (8 * u);
  }
  if (p.exact_idx) push_exact_round(p, g0, nthreads, exact, in);
}

template <Act A, typename S>
MEMSLIM_HD void backward_group(int64_t g, const BackwardParams<S>& p) {
  using C = typename compute_type<S>::type;
  const int64_t base = g * 8;
  const int cnt = group_count(p.n, g);
  const bool vec = cnt == 8 && p.aligned;
  Group8<S> gr, yv, out;
  load_group(p.grad, base, cnt, vec, gr);
  if (p.y) load_group(p.y, base, cnt, vec, yv);
  const uint8_t byte = p.bits ? p.bits[g] : uint8_t(0);
  MEMSLIM_UNROLL
  for (int j = 0; j < 8; ++j) {
    if (j >= cnt) break;
    C y = p.y ? load<C>(yv.v[j]) : C(0);
    bool b = (byte >> j) & 1u;
    out.v[j] = store<S>(chain<A, C>(load<C>(gr.v[j]), ActMath<A>::grad_from_output(y, b, p.act)));
  }
  store_group(p.grad_in, base, cnt, vec, out);
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
// The forward's rounds start at the same group index for every thread (so a
// warp stays converged for the exact list's reservation); size its grid with
// forward_threads(n).
template <Act A, typename S>
MEMSLIM_HD void forward_body(int64_t tid, int64_t nthreads, const ForwardParams<S>& p) {
  const int64_t ng = num_groups(p.n);
  const int64_t stride = nthreads * kForwardGroupsPerThread;
  for (int64_t r = 0; r < ng; r += stride) forward_round<A, S>(r + tid, nthreads, p);
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
