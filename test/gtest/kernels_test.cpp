//===- kernels_test.cpp - kernel bodies and math on the CPU, no torch ------===//
//
// The CUDA kernels are thin wrappers that call forward_body / backward_body /
// fixup_body with (blockIdx*blockDim + threadIdx, gridDim*blockDim). Here the
// same bodies run for every thread index of small launch grids, with aligned
// and misaligned pointers and a tail group, and must reproduce an element-by-
// element reference built from the ActMath definitions.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "memslim/kernels/dispatch.h"
#include "memslim/kernels/region_vm.h"

using namespace memslim::kernels;

namespace {

template <typename S>
S from_double(double v) {
  return store<S>(typename compute_type<S>::type(v));
}
template <typename S>
double to_double(S v) {
  return double(load<typename compute_type<S>::type>(v));
}
template <typename S>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::Float;
}
template <>
DType dtype_of<double>() {
  return DType::Double;
}
template <>
DType dtype_of<half_t>() {
  return DType::Half;
}
template <>
DType dtype_of<bf16_t>() {
  return DType::BFloat16;
}

struct Grid {
  int64_t blocks, threads;
};
const Grid kGrids[] = {{1, 1}, {3, 64}, {2, 7}, {40, 32}};

ActParams params_for(Act a) {
  ActParams p;
  switch (a) {
    case Act::Softplus:
      p.p0 = 2.0;
      p.p1 = 1.0;
      break; // low threshold: uses a bit
    case Act::Elu:
      p.p0 = 0.5;
      p.p1 = 2.0;
      p.p2 = 1.5;
      break;
    case Act::LeakyRelu:
      p.p0 = 0.2;
      break;
    default:
      break;
  }
  p.bits = act_uses_bits(a, p.p0, p.p1, p.p2);
  p.band = save_kind(a) == SaveKind::OutputBitsExact ? 0.05 : 0.0;
  return p;
}

template <Act A, typename S>
void check_bodies(int64_t n, int offset, const ActParams& p) {
  using C = typename compute_type<S>::type;
  std::mt19937 rng(1234);
  std::normal_distribution<double> dist(-0.5, 2.0);
  // Storage with room for a misaligning offset.
  std::vector<S> xs(n + 8), ys(n + 8), gs(n + 8), gis(n + 8);
  S* x = xs.data() + offset;
  S* y = ys.data() + offset;
  S* g = gs.data() + offset;
  S* gi = gis.data() + offset;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = from_double<S>(dist(rng));
    g[i] = from_double<S>(dist(rng));
  }
  const int64_t ng = num_groups(n);
  for (const Grid& grid : kGrids) {
    std::vector<uint8_t> bits(ng, 0xAA);
    std::vector<int32_t> idx(n);
    std::vector<S> val(n);
    unsigned long long count = 0;
    ForwardArgs fa;
    fa.x = x;
    fa.y = y;
    fa.bits = p.bits ? bits.data() : nullptr;
    fa.n = n;
    fa.act = p;
    const bool exact = act_has_exact_list(A, p);
    if (exact) {
      fa.exact_idx = idx.data();
      fa.exact_val = val.data();
      fa.exact_count = &count;
      fa.exact_cap = n;
    }
    const ForwardParams<S> fp = typed<S>(fa);
    EXPECT_EQ(fp.aligned, aligned16(x) && aligned16(y));
    const int64_t nthreads = grid.blocks * grid.threads;
    for (int64_t tid = 0; tid < nthreads; ++tid) forward_body<A, S>(tid, nthreads, fp);

    std::set<int32_t> expect_exact;
    for (int64_t i = 0; i < n; ++i) {
      const C xv = load<C>(x[i]);
      S ref = store<S>(ActMath<A>::forward(xv, p));
      ASSERT_EQ(std::memcmp(&ref, &y[i], sizeof(S)), 0) << "y at " << i;
      if (p.bits) {
        const bool b = (bits[i / 8] >> (i % 8)) & 1u;
        ASSERT_EQ(b, ActMath<A>::bit(xv, p)) << "bit at " << i;
      }
      if (exact && ActMath<A>::exact(xv, load<C>(ref), p)) expect_exact.insert(int32_t(i));
    }
    ASSERT_EQ(count, expect_exact.size());
    std::set<int32_t> got(idx.begin(), idx.begin() + int64_t(count));
    ASSERT_EQ(got, expect_exact);
    for (unsigned long long k = 0; k < count; ++k)
      ASSERT_EQ(std::memcmp(&val[k], &x[idx[k]], sizeof(S)), 0);

    // Backward + fixup over the same grid.
    BackwardArgs ba;
    ba.grad = g;
    ba.y = save_kind(A) == SaveKind::Mask ? nullptr : y;
    ba.bits = p.bits ? bits.data() : nullptr;
    ba.grad_in = gi;
    ba.n = n;
    ba.act = p;
    const BackwardParams<S> bp = typed<S>(ba);
    for (int64_t tid = 0; tid < nthreads; ++tid) backward_body<A, S>(tid, nthreads, bp);
    FixupArgs xa;
    xa.idx = idx.data();
    xa.val = val.data();
    xa.grad = g;
    xa.grad_in = gi;
    xa.count = int64_t(count);
    xa.act = p;
    const FixupParams<S> xp = typed<S>(xa);
    for (int64_t tid = 0; tid < nthreads; ++tid) fixup_body<A, S>(tid, nthreads, xp);
    for (int64_t i = 0; i < n; ++i) {
      const C xv = load<C>(x[i]);
      S ref;
      if (expect_exact.count(int32_t(i))) {
        ref = store<S>(chain_from_input<A, C>(load<C>(g[i]), xv, p));
      } else {
        const bool b = p.bits ? ((bits[i / 8] >> (i % 8)) & 1u) : false;
        const C yv = ba.y ? load<C>(y[i]) : C(0);
        ref = store<S>(chain<A, C>(load<C>(g[i]), ActMath<A>::grad_from_output(yv, b, p)));
      }
      ASSERT_EQ(std::memcmp(&ref, &gi[i], sizeof(S)), 0) << "grad at " << i;
    }
  }
}

template <Act A>
void check_all_dtypes(const ActParams& p = params_for(A)) {
  // 7: a tail group only; 448: whole forward rounds of the 14-thread grid
  // (14 threads x kForwardGroupsPerThread groups x 8); 1003: partial rounds.
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(8), int64_t(448), int64_t(1003)}) {
    for (int offset : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      check_bodies<A, float>(n, offset, p);
      check_bodies<A, double>(n, offset, p);
      check_bodies<A, half_t>(n, offset, p);
      check_bodies<A, bf16_t>(n, offset, p);
    }
  }
}

// elu with a negative input_scale: fp16 outputs overflow for x < -3.7 (the
// inputs reach -6.5), and those elements go through the exact list.
ActParams elu_overflow_params() {
  ActParams p;
  p.p0 = 1.0;
  p.p1 = 1.0;
  p.p2 = -3.0;
  p.bits = act_uses_bits(Act::Elu, p.p0, p.p1, p.p2);
  p.keep_overflow = true;
  return p;
}

} // namespace

#define BODY_TEST(NAME) \
  TEST(KernelBodies, NAME) { check_all_dtypes<Act::NAME>(); }
BODY_TEST(Gelu)
BODY_TEST(GeluTanh)
BODY_TEST(Silu)
BODY_TEST(Mish)
BODY_TEST(Softplus)
BODY_TEST(Elu)
BODY_TEST(LeakyRelu)
BODY_TEST(Hardswish)
BODY_TEST(Hardsigmoid)
BODY_TEST(Sigmoid)
BODY_TEST(Tanh)
BODY_TEST(Relu)
TEST(KernelBodies, EluOverflowList) { check_all_dtypes<Act::Elu>(elu_overflow_params()); }

// The CPU loops (chunked passes, libmvec vector math, AVX2 or baseline build)
// agree with the shared bodies: bits and exact lists exactly, outputs and
// gradients to a few ulp (vector libm variants round differently).
// extremes: every 97th input is one of finite values beyond `huge`, near
// FLT_MAX (a scaled output overflows) or near the minimum.
template <Act A, typename S>
void check_cpu_loops(int64_t n, const ActParams& p, bool extremes = false) {
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(-0.5, 2.0);
  std::vector<S> x(n), y1(n), y2(n), g(n), gi1(n), gi2(n), v1(n), v2(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = from_double<S>(dist(rng));
    g[i] = from_double<S>(dist(rng));
  }
  const double special[] = {1e19, -1e19, 2e38, -2e38, -0.75, -0.76, -0.27, -1.5, -1.49, 2.99, 3.0};
  for (int64_t i = 0, k = 0; extremes && i < n; i += 97, ++k)
    x[i] = from_double<S>(special[k % 11]);
  const int64_t ng = groups_for(n);
  std::vector<uint8_t> b1(ng), b2(ng);
  std::vector<int32_t> i1(n), i2(n);
  unsigned long long c1 = 0, c2 = 0;
  const bool exact = act_has_exact_list(A, p);
  ForwardArgs fa;
  fa.x = x.data();
  fa.n = n;
  fa.act = p;
  fa.exact_cap = n;
  fa.y = y1.data();
  fa.bits = p.bits ? b1.data() : nullptr;
  if (exact) {
    fa.exact_idx = i1.data();
    fa.exact_val = v1.data();
    fa.exact_count = &c1;
  }
  forward_cpu(A, dtype_of<S>(), fa, 0, ng / 2);
  forward_cpu(A, dtype_of<S>(), fa, ng / 2, ng);
  ForwardArgs fb = fa;
  fb.y = y2.data();
  fb.bits = p.bits ? b2.data() : nullptr;
  if (exact) {
    fb.exact_idx = i2.data();
    fb.exact_val = v2.data();
    fb.exact_count = &c2;
  }
  const ForwardParams<S> fp = typed<S>(fb);
  for (int64_t t = 0; t < 13; ++t) forward_body<A, S>(t, 13, fp);
  const double tol = sizeof(S) == 2 ? 1e-2 : 4e-6;
  for (int64_t i = 0; i < n; ++i)
    if (!(to_double(y1[i]) == to_double(y2[i]))) // equal infinities included
      ASSERT_NEAR(to_double(y1[i]), to_double(y2[i]), tol * (1 + std::fabs(to_double(y2[i])))) << i;
  EXPECT_EQ(b1, b2);
  ASSERT_EQ(c1, c2);
  std::set<int32_t> s1(i1.begin(), i1.begin() + int64_t(c1)),
      s2(i2.begin(), i2.begin() + int64_t(c2));
  EXPECT_EQ(s1, s2);
  BackwardArgs ba;
  ba.grad = g.data();
  ba.y = save_kind(A) == SaveKind::Mask ? nullptr : y2.data();
  ba.bits = p.bits ? b2.data() : nullptr;
  ba.n = n;
  ba.act = p;
  ba.grad_in = gi1.data();
  backward_cpu(A, dtype_of<S>(), ba, 0, ng);
  BackwardArgs bb = ba;
  bb.grad_in = gi2.data();
  const BackwardParams<S> bp = typed<S>(bb);
  for (int64_t t = 0; t < 13; ++t) backward_body<A, S>(t, 13, bp);
  for (int64_t i = 0; i < n; ++i)
    if (!(to_double(gi1[i]) == to_double(gi2[i])))
      ASSERT_NEAR(to_double(gi1[i]), to_double(gi2[i]), 10 * tol * (1 + std::fabs(to_double(g[i]))))
          << i;
}

template <Act A>
void check_cpu_loops_all(const ActParams& p = params_for(A)) {
  for (int64_t n : {int64_t(5), int64_t(1003), int64_t(5000)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    check_cpu_loops<A, float>(n, p);
    check_cpu_loops<A, double>(n, p);
    check_cpu_loops<A, half_t>(n, p);
    check_cpu_loops<A, bf16_t>(n, p);
  }
}

// The exact lists with a guard band (the runtime's; 0 in params_for) and an
// output scaled before saving (activation_dropout's 1/(1-p)), with inputs in
// the band, beyond `huge` and near FLT_MAX: the AVX-512 flags have one loop
// per (scaled, bits, exact list) combination.
template <Act A>
void check_cpu_loops_exact() {
  for (double scale : {1.0, 2.0}) {
    ActParams p = params_for(A);
    p.band = 0.05;
    p.out_scale = scale;
    p.out_max = 3.4028235677973366e38; // fp32 rounds to inf from here
    for (int64_t n : {int64_t(1003), int64_t(5000)}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " scale=" << scale);
      check_cpu_loops<A, float>(n, p, true);
    }
  }
}
TEST(CpuLoops, ExactListsGelu) { check_cpu_loops_exact<Act::Gelu>(); }
TEST(CpuLoops, ExactListsSilu) { check_cpu_loops_exact<Act::Silu>(); }
TEST(CpuLoops, ExactListsMish) { check_cpu_loops_exact<Act::Mish>(); }
TEST(CpuLoops, ExactListsGeluTanh) { check_cpu_loops_exact<Act::GeluTanh>(); }
TEST(CpuLoops, ExactListsHardswish) { check_cpu_loops_exact<Act::Hardswish>(); }

// hardswish's fp32 forward with flags wanted computes y in the AVX-512 flag
// loop: bit for bit the shared body's (NaN, infinities, signed zeros, the
// kinks at -3 and 3 included), with and without the exact list.
TEST(CpuLoops, HardswishForwardBitwise) {
  const int64_t n = 5000;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 3.f);
  const float special[] = {NAN,   INFINITY, -INFINITY, 0.f,   -0.f,   3.f,        -3.f,
                           -1.5f, 1e-40f,   -1e-40f,   3e38f, -3e38f, 2.9999998f, -2.9999998f};
  std::vector<float> x(n), y(n), v(n);
  for (int64_t i = 0; i < n; ++i) x[i] = i % 7 == 0 ? special[(i / 7) % 14] : dist(rng);
  std::vector<uint8_t> bits(groups_for(n));
  std::vector<int32_t> idx(n);
  for (bool exact : {false, true}) {
    ActParams p = params_for(Act::Hardswish);
    p.band = exact ? 0.05 : 0.0;
    unsigned long long count = 0;
    ForwardArgs fa;
    fa.x = x.data();
    fa.y = y.data();
    fa.bits = bits.data();
    fa.n = n;
    fa.act = p;
    if (exact) {
      fa.exact_idx = idx.data();
      fa.exact_val = v.data();
      fa.exact_count = &count;
      fa.exact_cap = n;
    }
    forward_cpu(Act::Hardswish, DType::Float, fa, 0, groups_for(n));
    for (int64_t i = 0; i < n; ++i) {
      const float r = ActMath<Act::Hardswish>::forward(x[i], p);
      uint32_t a, b;
      std::memcpy(&a, &y[i], 4);
      std::memcpy(&b, &r, 4);
      ASSERT_TRUE(a == b || (std::isnan(y[i]) && std::isnan(r))) << i << " x=" << x[i];
    }
  }
}

// gelu and its derivative in one pass (the act-consumers' and joins' backward
// recompute) against ActMath<Gelu>'s forward and grad_from_input evaluated in
// double: NaN where the reference is NaN (+-inf: 0 * inf, as aten), else within
// 8 units of the formulas' error scale (float: aten's Abramowitz-Stegun erf,
// 1.5e-7 absolute, as aten's own gelu; double: libm's erf / exp), on
// the ranges the parallel split gives (odd starts, tails under a chunk); the
// returned flag says whether the range held a NaN, an infinity or |x| >= 2^120.
template <typename T>
void check_gelu_value_derivative() {
  const int64_t n = 3001;
  std::mt19937 rng(5);
  std::normal_distribution<double> dist(0.0, 3.0);
  const double special[] = {NAN,  INFINITY, -INFINITY, 0.0, -0.0, 1e-30, -1e-30,
                            -5.2, -10.0,    -20.0,     9.0, 1e20, -1e20, 0.5};
  std::vector<T> x(n), y(n), d(n);
  for (int64_t i = 0; i < n; ++i) x[i] = T(i % 5 == 0 ? special[(i / 5) % 14] : dist(rng));
  const DType t = dtype_of<T>();
  for (auto [b, e] :
       {std::pair<int64_t, int64_t>{0, n}, {7, 300}, {1000, 1003}, {2999, 3001}, {1, 5}}) {
    std::fill(y.begin(), y.end(), T(-7));
    const bool edge = gelu_value_derivative_cpu(t, x.data(), y.data(), d.data(), b, e);
    bool want_edge = false;
    for (int64_t i = b; i < e; ++i) want_edge |= !(std::fabs(double(x[i])) < 0x1p120);
    ASSERT_EQ(edge, want_edge) << "[" << b << ", " << e << ")";
    for (int64_t i = 0; i < n; ++i) {
      if (i < b || i >= e) {
        ASSERT_EQ(y[i], T(-7)) << "wrote outside [b, e) at " << i;
        continue;
      }
      const double ry = ActMath<Act::Gelu>::forward(double(x[i]), ActParams{});
      const double rd = ActMath<Act::Gelu>::grad_from_input(double(x[i]), ActParams{});
      // The formulas' own rounding: 1 + erf cancels in the left tail, so the
      // error scale is u |x| for y and u (1 + |d|) for d, not u |y|.
      const double u = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;
      ASSERT_EQ(std::isnan(double(y[i])), std::isnan(ry)) << "y at x=" << x[i];
      ASSERT_EQ(std::isnan(double(d[i])), std::isnan(rd)) << "d at x=" << x[i];
      if (!std::isnan(ry))
        ASSERT_TRUE(double(y[i]) == ry || std::fabs(double(y[i]) - ry) <= 8 * u * std::fabs(x[i]))
            << "y at x=" << x[i] << ": " << y[i] << " vs " << ry;
      if (!std::isnan(rd))
        ASSERT_LE(std::fabs(double(d[i]) - rd), 8 * u * (1 + std::fabs(rd)))
            << "d at x=" << x[i] << ": " << d[i] << " vs " << rd;
    }
  }
}
TEST(CpuLoops, GeluValueDerivativeFloat) { check_gelu_value_derivative<float>(); }
TEST(CpuLoops, GeluValueDerivativeDouble) { check_gelu_value_derivative<double>(); }

#define CPU_LOOP_TEST(NAME) \
  TEST(CpuLoops, NAME) { check_cpu_loops_all<Act::NAME>(); }
CPU_LOOP_TEST(Gelu)
CPU_LOOP_TEST(GeluTanh)
CPU_LOOP_TEST(Silu)
CPU_LOOP_TEST(Mish)
CPU_LOOP_TEST(Softplus)
CPU_LOOP_TEST(Elu)
CPU_LOOP_TEST(LeakyRelu)
CPU_LOOP_TEST(Hardswish)
CPU_LOOP_TEST(Hardsigmoid)
CPU_LOOP_TEST(Sigmoid)
CPU_LOOP_TEST(Tanh)
CPU_LOOP_TEST(Relu)
TEST(CpuLoops, EluOverflowList) { check_cpu_loops_all<Act::Elu>(elu_overflow_params()); }

// Inversion: from the output and bit, the derivative of every activation
// matches the input-based formula in double, away from the guard band.
template <Act A>
void check_inverse(double lo, double hi, double band_skip) {
  ActParams p = params_for(A);
  p.band = 0;
  const double xs = detail::min_info<A>().x;
  for (int i = 0; i <= 20000; ++i) {
    const double x = lo + (hi - lo) * i / 20000.0;
    if (save_kind(A) == SaveKind::OutputBitsExact && std::fabs(x - xs) < band_skip) continue;
    const double y = ActMath<A>::forward(x, p);
    const double d = ActMath<A>::grad_from_output(y, ActMath<A>::bit(x, p), p);
    const double ref = ActMath<A>::grad_from_input(x, p);
    ASSERT_NEAR(d, ref, 1e-9) << "x=" << x;
  }
}

// Close to the minimum, where Newton on f stalled (fp64 errors of 1.8e-4 at
// |x - x*| = 1e-6): the inverse in double against the input formula, on a
// logarithmic sweep of |x - x*| from 1e-7 to 1 on both sides. The error
// floor is the output's rounding (and the formulas' own, a few ulp(y*) ~
// 3e-17 each; mish's forward is off by several) divided by |x - x*|:
// measured max |error| * |x - x*| = 2.2e-16 (gelu), 2.0e-16 (mish).
template <Act A>
void check_inverse_near_min() {
  ActParams p;
  const double xs = detail::min_info<A>().x;
  double worst = 0;
  for (int k = 0; k <= 7000; ++k) {
    const double u = std::pow(10.0, -7.0 + k / 1000.0);
    for (double x : {xs + u, xs - u}) {
      const double y = ActMath<A>::forward(x, p);
      const double d = ActMath<A>::grad_from_output(y, ActMath<A>::bit(x, p), p);
      const double ref = ActMath<A>::grad_from_input(x, p);
      ASSERT_NEAR(d, ref, 4e-16 / u + 1e-12) << "x=" << x << " u=" << u;
      worst = std::max(worst, std::fabs(d - ref) * u);
    }
  }
  std::printf("near-min inverse: max |error| * |x - x*| = %.2e\n", worst);
}

TEST(Inversion, DoubleNearMinimum) {
  check_inverse_near_min<Act::Gelu>();
  check_inverse_near_min<Act::GeluTanh>();
  check_inverse_near_min<Act::Silu>();
  check_inverse_near_min<Act::Mish>();
  check_inverse_near_min<Act::Hardswish>();
}

// Non-finite values: what aten's backward formulas give (torch 2.14, its
// vectorised CPU loop, which covers all but a tensor's tail).
TEST(NonFinite, InvertedActivationsGiveNaN) {
  ActParams p;
  const float inf = INFINITY, nan = NAN;
  // f' from the output of x, as the backward sees it.
  auto d = [&](auto act, auto x) {
    using Math = ActMath<decltype(act)::value>;
    return Math::grad_from_output(Math::forward(x, p), Math::bit(x, p), p);
  };
  for (float x : {nan, inf, -inf}) {
    EXPECT_TRUE(std::isnan(d(std::integral_constant<Act, Act::Gelu>(), x))) << x;
    EXPECT_TRUE(std::isnan(d(std::integral_constant<Act, Act::GeluTanh>(), x))) << x;
    EXPECT_TRUE(std::isnan(d(std::integral_constant<Act, Act::Silu>(), x))) << x;
    EXPECT_TRUE(std::isnan(d(std::integral_constant<Act, Act::Mish>(), double(x)))) << x;
    EXPECT_TRUE(std::isnan(ActMath<Act::GeluTanh>::grad_from_input(x, p))) << x;
  }
  // Finite but huge: into the exact list (aten's gelu(tanh) backward is NaN
  // once x^2 overflows); not the infinities, nor ordinary values.
  EXPECT_TRUE(ActMath<Act::GeluTanh>::exact(-1e30f, 0.f, p));
  EXPECT_TRUE(std::isnan(ActMath<Act::GeluTanh>::grad_from_input(-1e30f, p)));
  EXPECT_TRUE(ActMath<Act::Gelu>::exact(2e18f, 2e18f, p));
  EXPECT_TRUE(ActMath<Act::Silu>::exact(-1e200, 0.0, p));
  EXPECT_FALSE(ActMath<Act::Gelu>::exact(-inf, nan, p));
  EXPECT_FALSE(ActMath<Act::Gelu>::exact(nan, nan, p));
  EXPECT_FALSE(ActMath<Act::Gelu>::exact(5.f, 5.f, p));
}

TEST(NonFinite, HardswishAndChain) {
  ActParams p;
  const float inf = INFINITY, nan = NAN;
  auto d = [&](float x) {
    return ActMath<Act::Hardswish>::grad_from_output(ActMath<Act::Hardswish>::forward(x, p),
                                                     ActMath<Act::Hardswish>::bit(x, p), p);
  };
  EXPECT_EQ(d(-inf), 0.f);
  EXPECT_EQ(d(inf), 1.f);
  EXPECT_TRUE(std::isnan(d(nan)));
  // A NaN / inf grad_out: 0 where aten's kernel selects 0, NaN where it multiplies.
  EXPECT_EQ((chain<Act::Relu, float>(nan, 0.f)), 0.f);
  EXPECT_EQ((chain<Act::Hardsigmoid, float>(inf, 0.f)), 0.f);
  EXPECT_EQ((chain<Act::Hardswish, float>(nan, d(-5.f))), 0.f);
  EXPECT_EQ((chain_from_input<Act::Hardswish, float>(nan, -3.f, p)), 0.f);
  EXPECT_TRUE(std::isnan(chain_from_input<Act::Hardswish, float>(nan, -1.5f, p)));
  EXPECT_TRUE(std::isnan(chain<Act::Gelu, float>(inf, 0.f)));
  EXPECT_TRUE(std::isnan(chain<Act::LeakyRelu, float>(nan, 0.f)));
}

TEST(NonFinite, EluOverflowAndSign) {
  // celu(x, 1e5) in fp16: the output overflows, the derivative exp(x/1e5) does not.
  ActParams p;
  p.p0 = 1e5;
  p.p1 = 1.0;
  p.p2 = 1e-5;
  p.keep_overflow = elu_may_overflow(p.p0, p.p1, p.p2, 65504.0);
  EXPECT_TRUE(p.keep_overflow);
  EXPECT_FALSE(elu_may_overflow(1.0, 1.0, 1.0, 65504.0));
  EXPECT_TRUE(elu_may_overflow(1.0, 1.0, -0.5, 1.7e308));
  const float x = -2e5f;
  const float y = to_float(to_half(ActMath<Act::Elu>::forward(x, p)));
  EXPECT_TRUE(std::isinf(y));
  EXPECT_TRUE(ActMath<Act::Elu>::exact(x, y, p));
  EXPECT_FALSE(ActMath<Act::Elu>::exact(-INFINITY, -INFINITY, p));
  // A rounded y just below -alpha*scale: the derivative is clamped to 0, not negative.
  ActParams c;
  c.p0 = 0.7;
  c.p1 = 1.0;
  c.p2 = 1.0 / 0.7;
  const float yr = to_float(to_half(-0.7f)); // -0.7002
  EXPECT_EQ(ActMath<Act::Elu>::grad_from_output(yr, false, c), 0.f);
}

// fp32 backward of the inverting activations: derivative_tables.h, one
// polynomial per element. Against the exact derivative at the exact preimage
// of each float y (the double inversion), away from x* (where float(y*)'s own
// rounding dominates and the guard band keeps inputs exactly): within the
// table's error (generator: <= 1.4e-7) plus t's rounding. Both tables through
// the scalar function (CUDA's and the baseline loops' use the 32-piece one),
// and the CPU loops of this processor (AVX-512: 32 pieces, AVX2: 8; ctest
// reruns this capped at AVX2).
template <Act A>
void check_derivative_table() {
  ActParams p = params_for(A);
  p.band = 0;
  const double xs = detail::min_info<A>().x;
  std::vector<float> y;
  std::vector<double> ref;
  std::vector<bool> right;
  auto add = [&](double x) {
    if (std::fabs(x - xs) < 0.05) return;
    const float yf = float(ActMath<A>::forward(x, p));
    const bool b = ActMath<A>::bit(x, p);
    y.push_back(yf);
    right.push_back(b);
    ref.push_back(ActMath<A>::grad_from_output(double(yf), b, p));
  };
  for (int i = 0; i <= 400000; ++i) add(-60.0 + 120.0 * i / 400000.0);
  std::mt19937 rng(3);
  std::normal_distribution<double> dist(0.0, 1.0);
  for (int i = 0; i < 100000; ++i) add(dist(rng));
  const int64_t n = int64_t(y.size());
  std::vector<uint8_t> bits(groups_for(n), 0);
  for (int64_t i = 0; i < n; ++i)
    if (right[i]) bits[i / 8] |= uint8_t(1u << (i % 8));
  std::vector<float> g(n, 1.f), gi(n);
  BackwardArgs ba;
  ba.grad = g.data();
  ba.y = y.data();
  ba.bits = bits.data();
  ba.grad_in = gi.data();
  ba.n = n;
  ba.act = p;
  backward_cpu(A, DType::Float, ba, 0, groups_for(n));
  double worst_scalar = 0, worst_loop = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = detail::derivative_from_table<A, 32>(y[i], right[i]);
    ASSERT_NEAR(d, ref[i], 3e-7) << "y=" << y[i] << " right=" << right[i];
    const double d8 = detail::derivative_from_table<A, 8>(y[i], right[i]);
    ASSERT_NEAR(d8, ref[i], 3e-7) << "8 pieces: y=" << y[i] << " right=" << right[i];
    ASSERT_NEAR(double(gi[i]), ref[i], 3e-7) << "y=" << y[i] << " right=" << right[i];
    worst_scalar = std::max(worst_scalar, std::fabs(d - ref[i]));
    worst_loop = std::max(worst_loop, std::fabs(gi[i] - ref[i]));
  }
  std::printf("derivative table: max |error| scalar %.2e, CPU loops %.2e\n", worst_scalar,
              worst_loop);
}

TEST(DerivativeTables, Fp32WithinTableError) {
  check_derivative_table<Act::Gelu>();
  check_derivative_table<Act::GeluTanh>();
  check_derivative_table<Act::Silu>();
  check_derivative_table<Act::Mish>();
}

// The table's edges: f'(x*) = 0 at (and rounded below) the minimum, an
// underflowed left output gives +0, the right branch's end gives 1 exactly.
TEST(DerivativeTables, Edges) {
  const float ys = float(detail::min_info<Act::Gelu>().y);
  EXPECT_EQ(detail::derivative_from_table<Act::Gelu>(ys, true), 0.f);
  EXPECT_EQ(detail::derivative_from_table<Act::Gelu>(std::nextafter(ys, -1.f), false), 0.f);
  const float z = detail::derivative_from_table<Act::Gelu>(-0.f, false);
  EXPECT_EQ(z, 0.f);
  EXPECT_FALSE(std::signbit(z));
  EXPECT_EQ(detail::derivative_from_table<Act::Silu>(1e30f, true), 1.f);
  EXPECT_EQ(detail::derivative_from_table<Act::Mish>(7e3f, true), 1.f);
}

TEST(Inversion, DoubleMatchesInputFormula) {
  check_inverse<Act::Gelu>(-9, 20, 1e-4);
  check_inverse<Act::GeluTanh>(-8, 20, 1e-4);
  check_inverse<Act::Silu>(-40, 40, 1e-4);
  check_inverse<Act::Mish>(-40, 40, 1e-4);
  check_inverse<Act::Hardswish>(-6, 6, 1e-4);
  check_inverse<Act::Softplus>(-20, 20, 0);
  check_inverse<Act::Elu>(-20, 20, 0);
  check_inverse<Act::Sigmoid>(-20, 20, 0);
  check_inverse<Act::Tanh>(-8, 8, 0);
}

TEST(Inversion, FloatBranchesAndTails) {
  ActParams p;
  // Far left tails underflow to +-0 or tiny values: the derivative is ~0 there.
  for (float x : {-30.f, -15.f, -12.f, -9.f}) {
    const float y = ActMath<Act::Gelu>::forward(x, p);
    EXPECT_NEAR(ActMath<Act::Gelu>::grad_from_output(y, false, p), 0.f, 1e-6f) << x;
  }
  for (float x : {-200.f, -90.f, -60.f}) {
    const float y = ActMath<Act::Silu>::forward(x, p);
    EXPECT_NEAR(ActMath<Act::Silu>::grad_from_output(y, false, p), 0.f, 1e-6f) << x;
  }
  // x = 0 on the right branch: derivative 0.5 for gelu and silu.
  EXPECT_FLOAT_EQ(ActMath<Act::Gelu>::grad_from_output(0.f, true, p), 0.5f);
  EXPECT_FLOAT_EQ(ActMath<Act::Silu>::grad_from_output(0.f, true, p), 0.5f);
  // Hardswish kinks follow aten 2.14: x <= -3 -> 0, x >= 3 -> 1, +-0 -> 0.5.
  for (float x : {-5.f, -3.f, -0.f, 0.f, 3.f, 4.f}) {
    const float y = ActMath<Act::Hardswish>::forward(x, p);
    EXPECT_FLOAT_EQ(
        ActMath<Act::Hardswish>::grad_from_output(y, ActMath<Act::Hardswish>::bit(x, p), p),
        ActMath<Act::Hardswish>::grad_from_input(x, p))
        << x;
  }
}

TEST(Conversions, HalfRoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const half_t h{uint16_t(b)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_half(f).bits, h.bits) << b;
  }
}

TEST(Conversions, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const bf16_t h{uint16_t(b)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_bf16(f).bits, h.bits) << b;
  }
}

TEST(Conversions, RoundToNearestEven) {
  // 1 + 2^-11 is halfway between two halves: ties to the even 1.0.
  EXPECT_EQ(to_half(1.0f + 0.00048828125f).bits, 0x3c00);
  EXPECT_EQ(to_half(1.0f + 3 * 0.00048828125f).bits, 0x3c02);
  EXPECT_EQ(to_half(65520.f).bits, 0x7c00);            // rounds to inf
  EXPECT_EQ(to_half(5.96046448e-8f).bits, 0x0001);     // smallest subnormal
  EXPECT_EQ(to_bf16(1.0f + 0.00390625f).bits, 0x3f80); // tie -> even
  EXPECT_EQ(to_bf16(1.0f + 3 * 0.00390625f).bits, 0x3f82);
}

// ---- The region program (region_vm.h): analyses and loops -------------------

namespace rk = memslim::kernels::region;

// y = where(x > s, x * sigmoid(x), s * (exp(x) - 1)); registers: x 0, s 1, the
// constant 1 as scalar 2, then one per instruction.
rk::Program region_example() {
  rk::Program p;
  p.n_full = 1;
  p.n_scalar = 2;
  auto add = [&](rk::Op op, int a, int b = -1, int c = -1) {
    rk::Instr in;
    in.op = op, in.a = a, in.b = b, in.c = c;
    in.dst = 3 + static_cast<int>(p.code.size());
    p.code.push_back(in);
    return in.dst;
  };
  const int cond = add(rk::Op::Gt, 0, 1);
  const int sig = add(rk::Op::Sigmoid, 0);
  const int pos = add(rk::Op::Mul, 0, sig);
  const int e = add(rk::Op::Exp, 0);
  const int em1 = add(rk::Op::Sub, e, 2);
  const int neg = add(rk::Op::Mul, 1, em1);
  const int y = add(rk::Op::Where, cond, pos, neg);
  p.outputs = {y};
  p.n_regs = 3 + static_cast<int>(p.code.size());
  return p;
}

TEST(CpuLoops, RegionNeededGradients) {
  const rk::Program p = region_example();
  // Only x wants a gradient: s, the constant and the comparison need none.
  std::vector<uint8_t> wrt(p.n_regs, 0);
  wrt[0] = 1;
  auto need = rk::needed_gradients(p, wrt, {1});
  EXPECT_EQ(need[0], 1);
  EXPECT_EQ(need[1], 0);
  EXPECT_EQ(need[2], 0);
  EXPECT_EQ(need[3], 0); // x > s
  EXPECT_EQ(need[9], 1); // the where
  // s too: s * (exp(x) - 1) passes it on; the constant 1 still needs none.
  wrt[1] = 1;
  need = rk::needed_gradients(p, wrt, {1});
  EXPECT_EQ(need[1], 1);
  EXPECT_EQ(need[2], 0);
  // No output with a gradient: nothing.
  need = rk::needed_gradients(p, wrt, {0});
  for (uint8_t v : need) EXPECT_EQ(v, 0);
}

TEST(CpuLoops, RegionForwardBackwardMatchReference) {
  const rk::Program p = region_example();
  const int n = 1000; // not a multiple of the chunk; run as two ranges
  std::vector<float> x(n), g(n), y(n), gx(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 3.f);
  for (int i = 0; i < n; ++i) x[i] = dist(rng), g[i] = dist(rng);
  x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 0.25f; // x[3] == s
  const float s = 0.25f;
  const float scalars[2] = {s, 1.f};
  const float* in[1] = {x.data()};
  float* out[1] = {y.data()};
  rk::ForwardCall fc;
  fc.in = in, fc.scalars = scalars, fc.out = out;
  rk::region_forward_cpu(p, fc, 0, 300);
  rk::region_forward_cpu(p, fc, 300, n);
  std::vector<uint8_t> wrt(p.n_regs, 0);
  wrt[0] = wrt[1] = 1;
  const auto need = rk::needed_gradients(p, wrt, {1});
  const float* go[1] = {g.data()};
  float* gi[1] = {gx.data()};
  std::vector<double> sg(2, 0.0);
  rk::BackwardCall bc;
  bc.in = in, bc.scalars = scalars, bc.grad_out = go, bc.grad_in = gi, bc.need = need.data();
  bc.scalar_grad = sg.data();
  rk::region_backward_cpu(p, bc, 0, 700);
  rk::region_backward_cpu(p, bc, 700, n);
  double want_sg = 0;
  for (int i = 3; i < n; ++i) {
    const double xd = x[i], sd = s, sig = 1 / (1 + std::exp(-xd));
    const bool c = xd > sd;
    const double want_y = c ? xd * sig : sd * (std::exp(xd) - 1);
    const double want_gx = g[i] * (c ? sig + xd * sig * (1 - sig) : sd * std::exp(xd));
    if (!c) want_sg += g[i] * (std::exp(xd) - 1);
    EXPECT_NEAR(y[i], want_y, 4e-6 * std::max(1.0, std::fabs(want_y))) << i << " x=" << x[i];
    EXPECT_NEAR(gx[i], want_gx, 4e-6 * std::max(1.0, std::fabs(want_gx))) << i;
  }
  // Specials as eager autograd has them: NaN in, NaN out; +inf takes the first branch
  // (y = inf) and -inf the second (y = -s); both gradients are NaN, since where sends
  // 0 into the other branch, where 0 * inf appears (so s's gradient is NaN too).
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(gx[0]));
  EXPECT_EQ(y[1], INFINITY);
  EXPECT_EQ(y[2], -s);
  EXPECT_TRUE(std::isnan(gx[1]) && std::isnan(gx[2]));
  EXPECT_TRUE(std::isnan(sg[0]));
  // Without the specials, s's gradient is the sum over the second branch's elements.
  x[0] = x[1] = x[2] = 0.f;
  std::fill(sg.begin(), sg.end(), 0.0);
  rk::region_backward_cpu(p, bc, 0, n);
  EXPECT_NEAR(sg[0], want_sg, 1e-5 * std::fabs(want_sg));
}
