//===- softmax_rows_test.cpp - the loss head's rows kernel against double ----===//
//
// What: kernels' softmax_rows_cpu (linear_cross_entropy's chunk rows) against a
// double reference per row: log-sum-exp, picked logit, the logits' sum and the
// gradient scale * (softmax - (1 - eps) onehot - eps / V), fp32 and bf16 rows,
// vocabularies below a vector, at a block's edge and with a tail, logits past
// +-88, a NaN and a +inf logit (NaN rows), rows outside [b, e) untouched.
// Why: the op's values rest on it; the CpuLoops.* filter reruns it capped at
// each ISA build (test/CMakeLists.txt).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "memslim/kernels/dispatch.h"

using namespace memslim::kernels;

namespace {

template <typename S>
void check_rows(int64_t V, float spread) {
  const int64_t R = 6;
  std::mt19937 rng(static_cast<unsigned>(V));
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> zf(R * V);
  for (auto& v : zf) v = dist(rng);
  zf[2 * V + V / 2] = NAN;      // row 2: NaN
  zf[3 * V + V - 1] = INFINITY; // row 3: +inf
  std::vector<S> z(R * V);
  for (int64_t i = 0; i < R * V; ++i) z[i] = store<S>(zf[i]);
  std::vector<int64_t> tgt(R);
  for (int64_t r = 0; r < R; ++r) tgt[r] = (r * 7919) % V;
  std::vector<float> scale = {0.5f, 1.0f, 0.25f, 1.0f, 0.0f, 2.0f};
  std::vector<float> lse(R, -7), picked(R, -7), zsum(R, -7);
  const std::vector<S> orig = z;
  SoftmaxRowsArgs a;
  a.z = z.data();
  a.vocab = V;
  a.target = tgt.data();
  a.scale = scale.data();
  a.eps = 0.1f;
  a.lse = lse.data();
  a.picked = picked.data();
  a.zsum = zsum.data();
  const DType t = std::is_same_v<S, float> ? DType::Float : DType::BFloat16;
  softmax_rows_cpu(t, a, 1, R); // row 0 outside the range
  EXPECT_EQ(lse[0], -7.0f);
  for (int64_t i = 0; i < V; ++i) ASSERT_EQ(load<float>(z[i]), load<float>(orig[i]));
  const double u = std::is_same_v<S, float> ? 0x1p-22 : 0x1p-7;
  for (int64_t r = 1; r < R; ++r) {
    double m = -INFINITY, s = 0, zs = 0;
    bool nan = false;
    for (int64_t j = 0; j < V; ++j) {
      const double v = load<float>(orig[r * V + j]);
      nan |= std::isnan(v);
      m = std::max(m, v);
      zs += v;
    }
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(load<float>(orig[r * V + j])) - m);
    const double l = m + std::log(s);
    const bool bad = nan || !std::isfinite(l);
    ASSERT_EQ(std::isnan(double(lse[r])) || std::isinf(double(lse[r])), bad) << "row " << r;
    const float want_picked = load<float>(orig[r * V + tgt[r]]);
    ASSERT_TRUE(picked[r] == want_picked || (std::isnan(picked[r]) && std::isnan(want_picked)));
    if (!bad) {
      ASSERT_NEAR(lse[r], l, 8 * 0x1p-24 * (std::fabs(l) + std::fabs(m))) << "row " << r;
      ASSERT_NEAR(zsum[r], zs, 1e-5 * (1 + std::fabs(zs)) * std::sqrt(double(V)));
    }
    for (int64_t j = 0; j < V; ++j) {
      const double g = load<float>(z[r * V + j]);
      if (bad) {
        ASSERT_TRUE(std::isnan(g)) << "row " << r << " j " << j;
        continue;
      }
      const double x = double(load<float>(orig[r * V + j])) - l;
      const double p = std::exp(x);
      const double one = j == tgt[r] ? 0.9 : 0.0;
      const double want = scale[r] * (p - one - 0.1 / double(V));
      // each term's rounding, and exp's of a float argument (|x| ulps of it)
      const double tol = scale[r] * (8 * u * (p + one + 0.1 / double(V)) +
                                     p * (std::fabs(x) + std::fabs(l) + 1) * 0x1p-22);
      ASSERT_NEAR(g, want, tol) << "row " << r << " j " << j;
    }
  }
}

} // namespace

TEST(CpuLoops, SoftmaxRowsFloat) {
  for (int64_t V : {1, 7, 16, 512, 1000, 4099}) check_rows<float>(V, 3.0f);
  check_rows<float>(600, 60.0f); // logits past +-88: exp needs the max
}
TEST(CpuLoops, SoftmaxRowsBf16) {
  for (int64_t V : {7, 513, 2048}) check_rows<bf16_t>(V, 3.0f);
}
