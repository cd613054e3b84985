//===- cpu_joins_impl.h - CPU loops of the joins and gelu's recompute -----===//
//
// What: the residual joins' rows (y += relu(r) or + r, with each channel's largest term),
// their rebuild in backward, and gelu with its derivative in one pass (act_with_derivative),
// for one instruction set.
// Why: loops of the norm and consumer ops beside the activation loops of cpu_loops_impl.h,
// which includes this file; inside namespace MEMSLIM_CPU_NS.
//
//===----------------------------------------------------------------------===//
#include <cmath>
#include <cstring>

#include "simd_math.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {

template <typename T>
inline T relu_of(T v) {
  return v < T(0) ? T(0) : v; // aten's clamp_min(v, 0): NaN and -0.0 pass through
}

// One row of a join: y += term(r), returns max(m, |term(r)| over the row),
// NaN-propagating. Relu: term = relu (>= 0 or NaN: its own absolute value);
// else term = identity (r is the activation, computed already).
template <bool Relu, typename T>
T join_row(T* __restrict y, const T* __restrict r, int64_t S, T m) {
  if constexpr (Relu)
    for (int64_t s = 0; s < S; ++s) y[s] = relu_of(r[s]) + y[s];
  else
    for (int64_t s = 0; s < S; ++s) y[s] = r[s] + y[s];
  int64_t s = 0;
  bool nan = false;
#if defined(__AVX2__)
  if constexpr (sizeof(T) == sizeof(float)) {
    __m256 vm = _mm256_set1_ps(-__builtin_inff());
    __m256 vn = _mm256_setzero_ps();
    const __m256 zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; s + 8 <= S; s += 8) {
      const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(r) + s);
      vn = _mm256_or_ps(vn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      // NaN lanes: flagged in vn
      vm = _mm256_max_ps(vm, Relu ? _mm256_max_ps(v, zero) : _mm256_andnot_ps(sign, v));
    }
    nan = _mm256_movemask_ps(vn) != 0;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vm);
    for (float l : lanes) m = l > m ? T(l) : m;
  }
#endif
  for (; s < S; ++s) {
    const T a = Relu ? relu_of(r[s]) : std::fabs(r[s]);
    if (a != a) nan = true;
    m = a > m ? a : m;
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

// Rows [b, e): a NaN maximum stays NaN (nothing compares greater than it).
template <bool Relu, typename T>
void join_rows(T* y, const T* r, T* cmax, int64_t C, int64_t S, int64_t b, int64_t e) {
  for (int64_t row = b; row < e; ++row)
    cmax[row % C] = join_row<Relu, T>(y + row * S, r + row * S, S, cmax[row % C]);
}

template <bool Relu>
void join_forward(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S, int64_t b,
                  int64_t e) {
  if (t == DType::Float)
    join_rows<Relu>(static_cast<float*>(y), static_cast<const float*>(r), static_cast<float*>(cmax),
                    C, S, b, e);
  else
    join_rows<Relu>(static_cast<double*>(y), static_cast<const double*>(r),
                    static_cast<double*>(cmax), C, S, b, e);
}

void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S,
                           int64_t b, int64_t e) {
  join_forward<true>(t, y, r, cmax, C, S, b, e);
}
void add_join_forward_cpu(DType t, void* y, const void* a, void* cmax, int64_t C, int64_t S,
                          int64_t b, int64_t e) {
  join_forward<false>(t, y, a, cmax, C, S, b, e);
}

// gelu (erf form) and its derivative in one pass sharing one exp: aten's CPU
// formulas, gelu = x * 0.5 * (1 + erf(x / sqrt 2)) and gelu' = 0.5 (1 + erf) +
// x exp(-x^2 / 2) / sqrt(2 pi). float: with aten's vectorised erf (the
// Abramowitz-Stegun 7.1.26 form, sign(z) (1 - t r(t) exp(-z^2)), z = x / sqrt 2,
// whose exp(-z^2) is the derivative's exp too), in chunks: exp's argument is
// clamped at -80 in a pass of its own and stored (in one loop GCC moved the
// clamp after the call, and libmvec's expf left its fast path for large |x|:
// 4-8 ns per element against 0.4), and the exp counts as 0 beyond, where erf is
// +-1 and x exp(-z^2) under 1e-33. double: libm's erf and exp. Returns whether
// an x is NaN, infinite or >= 2^120 (see launch.h).
template <typename T>
bool gelu_value_derivative_range(const T* __restrict x, T* __restrict y, T* __restrict d, int64_t b,
                                 int64_t e) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t kChunk = 256;
    alignas(64) float ex[kChunk];
    for (int64_t c = b; c < e; c += kChunk) {
      const int64_t len = e - c < kChunk ? e - c : kChunk;
      const float* xc = x + c;
      for (int64_t i = 0; i < len; ++i) {
        const float z = xc[i] * 0.70710678118654752440f;
        ex[i] = z * z < 80.f ? z * z : 80.f;
      }
      for (int64_t i = 0; i < len; ++i) ex[i] = m::exp(-ex[i]);
      for (int64_t i = 0; i < len; ++i) {
        const float xv = xc[i];
        const float z = xv * 0.70710678118654752440f;
        const float t = 1.f / m::fma(0.3275911f, m::fabs(z), 1.f);
        const float r =
            m::fma(m::fma(m::fma(m::fma(1.061405429f, t, -1.453152027f), t, 1.421413741f), t,
                          -0.284496736f),
                   t, 0.254829592f);
        const float ez = z * z < 80.f ? ex[i] : 0.f;
        const float er = std::copysign(m::fma(-ez * t, r, 1.f), z);
        y[c + i] = xv * 0.5f * (1.f + er);
        d[c + i] = 0.5f * (1.f + er) + xv * (ez * 0.39894228040143267794f);
      }
    }
  } else {
    for (int64_t i = b; i < e; ++i) {
      const T xv = x[i];
      const T er = m::erf(xv * T(0.70710678118654752440));
      y[i] = xv * T(0.5) * (T(1) + er);
      d[i] = T(0.5) * (T(1) + er) + xv * (m::exp(T(-0.5) * xv * xv) * T(0.39894228040143267794));
    }
  }
  // (A count, apart: a flag or-ed inside the loops above kept them scalar.)
  int64_t huge = 0;
  for (int64_t i = b; i < e; ++i) huge += !(m::fabs(x[i]) < T(0x1p120));
  return huge != 0;
}

bool gelu_value_derivative_cpu(DType t, const void* x, void* y, void* d, int64_t b, int64_t e) {
  if (t == DType::Float)
    return gelu_value_derivative_range(static_cast<const float*>(x), static_cast<float*>(y),
                                       static_cast<float*>(d), b, e);
  return gelu_value_derivative_range(static_cast<const double*>(x), static_cast<double*>(y),
                                     static_cast<double*>(d), b, e);
}

template <typename T>
void relu_join_rebuild_range(T* __restrict y, const T* __restrict out, const T* __restrict r,
                             int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) y[i] = out[i] - relu_of(r[i]);
}

void relu_join_rebuild_cpu(DType t, void* y, const void* out, const void* r, int64_t b, int64_t e) {
  if (t == DType::Float)
    relu_join_rebuild_range(static_cast<float*>(y), static_cast<const float*>(out),
                            static_cast<const float*>(r), b, e);
  else
    relu_join_rebuild_range(static_cast<double*>(y), static_cast<const double*>(out),
                            static_cast<const double*>(r), b, e);
}

} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim
