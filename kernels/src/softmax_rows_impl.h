//===- softmax_rows_impl.h - the loss head's rows: log-sum-exp and gradient -===//
//
// What: softmax_rows_cpu for linear_cross_entropy's chunks of logits (fp32 or
// bf16 rows, math in fp32): per row its max, the logit at its target, the sum
// of its logits (label smoothing) and its log-sum-exp; with a gradient scale,
// the row is overwritten by the logits' gradient
//   scale * (softmax(z) - (1 - eps) * onehot(target) - eps / vocab)
// (bf16 rows: rounded once, as aten's fp32 gradient cast to the linear's dtype).
// Three passes per row, the first from memory, the others on the row while it
// sits in the core's L2 (a row of 128,256 fp32 logits is 501 KB); exp(z - max)
// is evaluated twice (sum, then gradient) rather than written and read back.
// Why: aten's ops for the same (amax, sub_, exp_, sum, mul_, scatter) run five
// passes over a chunk larger than the caches: the chunked head spent more in them
// than Inductor's fused log_softmax (bench/results/loss_head_2026-11-29b.md).
// Included by cpu_loops_impl.h inside namespace MEMSLIM_CPU_NS (one copy per ISA;
// GCC vectorises the exp loops with libmvec, simd_math.h).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {
namespace rows {

constexpr int64_t kBlock = 512; // elements per inner pass (2 KiB of fp32)
// The build's vector width (partial sums and maxima lane by lane).
#if defined(__AVX512F__)
constexpr int kW = 16;
#elif defined(__AVX2__)
constexpr int kW = 8;
#else
constexpr int kW = 4;
#endif
typedef float vw __attribute__((vector_size(kW * 4)));

MEMSLIM_HD vw vw_load(const float* p) {
  vw v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
MEMSLIM_HD float vw_sum(vw v) {
  float s = 0;
  for (int l = 0; l < kW; ++l) s += v[l];
  return s;
}

// A block of the row as fp32 (bf16 widened exactly); `buf` when a copy is needed.
template <typename S>
const float* block_f32(const S* p, int64_t n, float* buf) {
  if constexpr (std::is_same_v<S, float>) {
    (void)n, (void)buf;
    return p;
  } else {
    for (int64_t k = 0; k < n; ++k) buf[k] = load<float>(p[k]);
    return buf;
  }
}

// max (NaN lanes skipped: a NaN still reaches the sum of exp and the log-sum-exp)
// and the sum of the row's logits (block sums in fp32, their total in double).
template <typename S>
void row_max_sum(const S* z, int64_t V, float* buf, float& m, double& total) {
  const float ninf = -std::numeric_limits<float>::infinity();
  vw mv;
  for (int l = 0; l < kW; ++l) mv[l] = ninf;
  float ms = ninf;
  total = 0;
  for (int64_t j0 = 0; j0 < V; j0 += kBlock) {
    const int64_t n = std::min(kBlock, V - j0);
    const float* p = block_f32(z + j0, n, buf);
    vw sv = {};
    int64_t k = 0;
    for (; k + kW <= n; k += kW) {
      const vw v = vw_load(p + k);
      mv = v > mv ? v : mv;
      sv += v;
    }
    float s = vw_sum(sv);
    for (; k < n; ++k) {
      ms = p[k] > ms ? p[k] : ms;
      s += p[k];
    }
    total += s;
  }
  for (int l = 0; l < kW; ++l) ms = mv[l] > ms ? mv[l] : ms;
  m = ms;
}

// sum_j exp(z_j - m), block sums in fp32, their total in double.
template <typename S>
double row_sum_exp(const S* z, int64_t V, float m, float* buf, float* e) {
  double total = 0;
  for (int64_t j0 = 0; j0 < V; j0 += kBlock) {
    const int64_t n = std::min(kBlock, V - j0);
    const float* p = block_f32(z + j0, n, buf);
    for (int64_t k = 0; k < n; ++k) e[k] = expf(p[k] - m);
    vw sv = {};
    int64_t k = 0;
    for (; k + kW <= n; k += kW) sv += vw_load(e + k);
    float s = vw_sum(sv);
    for (; k < n; ++k) s += e[k];
    total += s;
  }
  return total;
}

// z_j <- exp(z_j - m) * k - c - (j == t ? tk : 0), rounded once to the row's
// storage type.
template <typename S>
void row_gradient(S* z, int64_t V, float m, float k, float c, int64_t t, float tk, float* buf,
                  float* e) {
  for (int64_t j0 = 0; j0 < V; j0 += kBlock) {
    const int64_t n = std::min(kBlock, V - j0);
    const float* p = block_f32(z + j0, n, buf);
    for (int64_t i = 0; i < n; ++i) e[i] = expf(p[i] - m) * k - c;
    if (t >= j0 && t < j0 + n) e[t - j0] -= tk;
    if constexpr (std::is_same_v<S, float>)
      std::memcpy(z + j0, e, n * sizeof(float));
    else
      for (int64_t i = 0; i < n; ++i) z[j0 + i] = store<S>(e[i]);
  }
}

template <typename S>
void run(const SoftmaxRowsArgs& a, int64_t b, int64_t e) {
  alignas(64) float buf[kBlock], ex[kBlock];
  S* base = static_cast<S*>(a.z);
  const int64_t V = a.vocab;
  for (int64_t r = b; r < e; ++r) {
    S* z = base + r * V;
    const int64_t t = a.target[r];
    const float picked = load<float>(z[t]);
    float m;
    double zsum;
    row_max_sum(z, V, buf, m, zsum);
    const double sum = row_sum_exp(z, V, m, buf, ex);
    const float lse = static_cast<float>(static_cast<double>(m) + std::log(sum));
    a.lse[r] = lse;
    a.picked[r] = picked;
    if (a.zsum) a.zsum[r] = static_cast<float>(zsum);
    if (!a.scale) continue;
    // NaN for a row whose log-sum-exp is not finite (aten's log_softmax inf - inf).
    const float sc = a.scale[r] + (lse - lse);
    const float k = sc / static_cast<float>(sum);
    const float c = sc * (a.eps / static_cast<float>(V));
    row_gradient(z, V, m, k, c, t, sc * (1.0f - a.eps), buf, ex);
  }
}

} // namespace rows

void softmax_rows_cpu(DType t, const SoftmaxRowsArgs& a, int64_t b, int64_t e) {
  if (t == DType::BFloat16)
    rows::run<bf16_t>(a, b, e);
  else
    rows::run<float>(a, b, e);
}

} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim
