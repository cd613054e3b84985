//===- kernel_rounds_test.cpp - the forward body's rounds and exact list ---===//
//
// What: the forward body (a thread takes kForwardGroupsPerThread groups per
// round and reserves its exact-list slots once per round) run for every thread
// index of small launch grids, with the list's capacity below its length, and
// reserve_slots on the host. kernels_test.cpp checks outputs, bits, lists and
// gradients of every body; this file the list's capacity and reservation.
// Why: the reservation replaced one atomic per exact element (the first GPU
// run, 2026-11-30); what it writes past the capacity is new code.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "memslim/kernels/dispatch.h"

using namespace memslim::kernels;

namespace {

template <typename S>
S from_double(double v) {
  return store<S>(typename compute_type<S>::type(v));
}

struct Grid {
  int64_t blocks, threads;
};
const Grid kGrids[] = {{1, 1}, {3, 64}, {2, 7}, {40, 32}};

// The exact list past its capacity: the count is the full length, the first
// `cap` slots hold distinct members with their inputs, nothing is written past
// them (the caller reruns with the count), for every grid, aligned or not.
template <Act A, typename S>
void check_exact_past_capacity(int64_t n, int offset) {
  using C = typename compute_type<S>::type;
  ActParams p;
  p.bits = act_uses_bits(A, p.p0, p.p1, p.p2);
  p.band = 0.5; // many members
  std::mt19937 rng(99);
  std::normal_distribution<double> dist(-0.5, 1.0);
  std::vector<S> xs(n + 8), ys(n + 8);
  S* x = xs.data() + offset;
  for (int64_t i = 0; i < n; ++i) x[i] = from_double<S>(dist(rng));
  std::set<int32_t> members;
  for (int64_t i = 0; i < n; ++i) {
    const C xv = load<C>(x[i]);
    if (ActMath<A>::exact(xv, load<C>(store<S>(ActMath<A>::forward(xv, p))), p))
      members.insert(int32_t(i));
  }
  ASSERT_GT(members.size(), 8u);
  const int64_t cap = int64_t(members.size()) / 3;
  for (const Grid& grid : kGrids) {
    std::vector<uint8_t> bits(num_groups(n));
    std::vector<int32_t> idx(n, -1);
    std::vector<S> val(n);
    unsigned long long count = 0;
    ForwardArgs fa;
    fa.x = x;
    fa.y = ys.data() + offset;
    fa.bits = p.bits ? bits.data() : nullptr;
    fa.n = n;
    fa.act = p;
    fa.exact_idx = idx.data();
    fa.exact_val = val.data();
    fa.exact_count = &count;
    fa.exact_cap = cap;
    const ForwardParams<S> fp = typed<S>(fa);
    const int64_t nthreads = grid.blocks * grid.threads;
    for (int64_t tid = 0; tid < nthreads; ++tid) forward_body<A, S>(tid, nthreads, fp);
    ASSERT_EQ(count, members.size());
    std::set<int32_t> got;
    for (int64_t k = 0; k < cap; ++k) {
      ASSERT_TRUE(members.count(idx[k])) << "slot " << k;
      ASSERT_EQ(std::memcmp(&val[k], &x[idx[k]], sizeof(S)), 0);
      got.insert(idx[k]);
    }
    ASSERT_EQ(int64_t(got.size()), cap);
    for (int64_t k = cap; k < n; ++k) ASSERT_EQ(idx[k], -1) << "written past the capacity";
  }
}

} // namespace

TEST(KernelBodies, ExactListPastCapacity) {
  for (int64_t n : {int64_t(1003), int64_t(448)}) {
    for (int offset : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      check_exact_past_capacity<Act::Gelu, float>(n, offset);
      check_exact_past_capacity<Act::Silu, bf16_t>(n, offset);
      check_exact_past_capacity<Act::Hardswish, half_t>(n, offset);
      check_exact_past_capacity<Act::Mish, double>(n, offset);
    }
  }
}

// reserve_slots on the host: consecutive ranges, no change for k = 0.
TEST(KernelBodies, ReserveSlots) {
  unsigned long long count = 5;
  EXPECT_EQ(reserve_slots(&count, 3), 5ull);
  EXPECT_EQ(reserve_slots(&count, 0), 0ull);
  EXPECT_EQ(count, 8ull);
  EXPECT_EQ(reserve_slots(&count, 32), 8ull);
  EXPECT_EQ(count, 40ull);
  EXPECT_EQ(popcount32(0u), 0);
  EXPECT_EQ(popcount32(0xffffffffu), 32);
  EXPECT_EQ(popcount32(0x80000101u), 3);
}
