//===- cpu_loops_impl.h - CPU loops over element ranges (one ISA per TU) ----===//
//
// What: the CPU forward / backward / fix-up loops. They use the very per-element
// math of activations.h that the CUDA bodies use, but are laid out for SIMD:
// each range is cut into L1-sized chunks, and each chunk goes through separate
// straight-line passes (outputs; bits; exact-list scan; for the inverting
// activations a branch-free fast derivative, then the general path only for the
// few elements it does not cover) so GCC vectorises the math with libmvec.
// Included by cpu_loops.cpp (baseline x86-64) and cpu_loops_avx2.cpp (AVX2+FMA)
// inside namespace MEMSLIM_CPU_NS; cpu_dispatch.cpp picks one at run time.
//
//===----------------------------------------------------------------------===//
#include <cstring>
#include <limits>

#include "simd_math.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {

constexpr int64_t kChunk = 512;  // elements per pass; a multiple of 8

template <Act A> constexpr bool has_fast_inverse() {
  return A == Act::Gelu || A == Act::GeluTanh || A == Act::Silu || A == Act::Mish;
}

template <Act A, typename S>
void forward_range(const ForwardParams<S>& p, int64_t gb, int64_t ge) {
  using C = typename compute_type<S>::type;
  const int64_t begin = gb * 8;
  const int64_t end = ge * 8 < p.n ? ge * 8 : p.n;
  // A local copy: parameter loads inside a select (x > 0 ? x : x * slope) are
  // then plain register reads the vectoriser may speculate.
  const ActParams act = p.act;
  C xv[kChunk];
  unsigned char bv[kChunk];
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t len = end - c0 < kChunk ? end - c0 : kChunk;
    const S* __restrict x = p.x + c0;
    for (int64_t i = 0; i < len; ++i) xv[i] = load<C>(x[i]);
    if (p.y) {
      S* __restrict y = p.y + c0;
      for (int64_t i = 0; i < len; ++i) y[i] = store<S>(ActMath<A>::forward(xv[i], act));
    }
    if (p.bits) {
      for (int64_t i = 0; i < len; ++i) bv[i] = ActMath<A>::bit(xv[i], act) ? 1 : 0;
      for (int64_t i = len; i < ((len + 7) & ~int64_t(7)); ++i) bv[i] = 0;
      uint8_t* __restrict bits = p.bits + c0 / 8;
      const int64_t groups = (len + 7) / 8;
      int64_t g = 0;
#if defined(__AVX2__)
      // 32 flags (0/1 bytes) -> 4 packed bytes: bit 0 of each byte to its top bit,
      // then movemask (bit i = element i, little-endian: byte k = elements 8k..8k+7).
      for (; g + 4 <= groups; g += 4) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bv + 8 * g));
        const uint32_t m = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(v, 7)));
        std::memcpy(bits + g, &m, 4);
      }
#endif
      for (; g < groups; ++g) {
        const unsigned char* b = bv + 8 * g;
        bits[g] = uint8_t(b[0] | b[1] << 1 | b[2] << 2 | b[3] << 3 | b[4] << 4 | b[5] << 5 |
                          b[6] << 6 | b[7] << 7);
      }
    }
    if (p.exact_idx) {
      // Decided from x and the output as stored (elu keeps overflowed ones).
      if (p.y) {
        for (int64_t i = 0; i < len; ++i)
          bv[i] = ActMath<A>::exact(xv[i], load<C>(p.y[c0 + i]), act) ? 1 : 0;
      } else {
        for (int64_t i = 0; i < len; ++i) {
          const C yi = load<C>(store<S>(ActMath<A>::forward(xv[i], act)));
          bv[i] = ActMath<A>::exact(xv[i], yi, act) ? 1 : 0;
        }
      }
      // Most chunks hold no exact element: one vectorised OR decides.
      unsigned char any = 0;
      for (int64_t i = 0; i < len; ++i) any |= bv[i];
      if (!any) continue;
      for (int64_t i = 0; i < len; ++i) {
        if (!bv[i]) continue;
        const unsigned long long k = atomic_add(p.exact_count, 1ull);
        if (int64_t(k) < p.exact_cap) {
          p.exact_idx[k] = int32_t(c0 + i);
          p.exact_val[k] = x[i];
        }
      }
    }
  }
}

template <Act A, typename S>
void backward_range(const BackwardParams<S>& p, int64_t gb, int64_t ge) {
  using C = typename compute_type<S>::type;
  const int64_t begin = gb * 8;
  const int64_t end = ge * 8 < p.n ? ge * 8 : p.n;
  const ActParams act = p.act;  // see forward_range
  C yv[kChunk], dv[kChunk];
  unsigned char bv[kChunk], okv[kChunk];  // bytes, not bool: GCC vectorises these
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t len = end - c0 < kChunk ? end - c0 : kChunk;
    if (p.y) {
      for (int64_t i = 0; i < len; ++i) yv[i] = load<C>(p.y[c0 + i]);
    } else {
      for (int64_t i = 0; i < len; ++i) yv[i] = C(0);
    }
    if (p.bits) {
      const uint8_t* bits = p.bits + c0 / 8;
      for (int64_t g = 0; g < (len + 7) / 8; ++g) {
        const unsigned byte = bits[g];
        for (int j = 0; j < 8; ++j) bv[8 * g + j] = (byte >> j) & 1u;
      }
    } else {
      for (int64_t i = 0; i < len; ++i) bv[i] = 0;
    }
    if constexpr (has_fast_inverse<A>() && sizeof(C) == sizeof(float)) {
      for (int64_t i = 0; i < len; ++i) {
        bool ok;
        dv[i] = detail::fast_inverse_derivative<A, C>(yv[i], bv[i] != 0, ok);
        okv[i] = ok ? 1 : 0;
      }
      for (int64_t i = 0; i < len; ++i)
        if (!okv[i]) dv[i] = ActMath<A>::grad_from_output(yv[i], bv[i] != 0, act);
    } else {
      for (int64_t i = 0; i < len; ++i)
        dv[i] = ActMath<A>::grad_from_output(yv[i], bv[i] != 0, act);
    }
    const S* __restrict g = p.grad + c0;
    S* __restrict gi = p.grad_in + c0;
    for (int64_t i = 0; i < len; ++i) gi[i] = store<S>(chain<A, C>(load<C>(g[i]), dv[i]));
  }
}

struct ForwardRange {
  template <Act A, typename S>
  static void run(const ForwardArgs& a, int64_t b, int64_t e) {
    forward_range<A, S>(typed<S>(a), b, e);
  }
};
struct BackwardRange {
  template <Act A, typename S>
  static void run(const BackwardArgs& a, int64_t b, int64_t e) {
    backward_range<A, S>(typed<S>(a), b, e);
  }
};
struct FixupRange {
  template <Act A, typename S>
  static void run(const FixupArgs& a, int64_t b, int64_t e) {
    const FixupParams<S> p = typed<S>(a);
    for (int64_t k = b; k < e; ++k) fixup_one<A, S>(k, p);
  }
};

template <typename T>
inline T relu_of(T v) {
  return v < T(0) ? T(0) : v; // aten's clamp_min(v, 0): NaN and -0.0 pass through
}

// One row: y += relu(r); returns max(m, relu(r) over the row), NaN-propagating.
template <typename T>
T relu_join_row(T* __restrict y, const T* __restrict r, int64_t S, T m) {
  for (int64_t s = 0; s < S; ++s) y[s] = relu_of(r[s]) + y[s];
  int64_t s = 0;
  bool nan = false;
#if defined(__AVX2__)
  if constexpr (sizeof(T) == sizeof(float)) {
    __m256 vm = _mm256_set1_ps(-__builtin_inff());
    __m256 vn = _mm256_setzero_ps();
    const __m256 zero = _mm256_setzero_ps();
    for (; s + 8 <= S; s += 8) {
      const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(r) + s);
      vn = _mm256_or_ps(vn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      vm = _mm256_max_ps(vm, _mm256_max_ps(v, zero)); // NaN lanes: flagged in vn
    }
    nan = _mm256_movemask_ps(vn) != 0;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vm);
    for (float l : lanes) m = l > m ? T(l) : m;
  }
#endif
  for (; s < S; ++s) {
    const T a = relu_of(r[s]);
    if (a != a) nan = true;
    m = a > m ? a : m;
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

// Rows [b, e): a NaN maximum stays NaN (nothing compares greater than it).
template <typename T>
void relu_join_rows(T* y, const T* r, T* cmax, int64_t C, int64_t S, int64_t b, int64_t e) {
  for (int64_t row = b; row < e; ++row)
    cmax[row % C] = relu_join_row<T>(y + row * S, r + row * S, S, cmax[row % C]);
}

void relu_join_forward_cpu(DType t, void* y, const void* r, void* cmax, int64_t C, int64_t S,
                           int64_t b, int64_t e) {
  if (t == DType::Float)
    relu_join_rows(static_cast<float*>(y), static_cast<const float*>(r), static_cast<float*>(cmax),
                   C, S, b, e);
  else
    relu_join_rows(static_cast<double*>(y), static_cast<const double*>(r),
                   static_cast<double*>(cmax), C, S, b, e);
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

void forward_cpu(Act a, DType t, const ForwardArgs& args, int64_t b, int64_t e) {
  dispatch<ForwardRange>(a, t, args, b, e);
}
void backward_cpu(Act a, DType t, const BackwardArgs& args, int64_t b, int64_t e) {
  dispatch<BackwardRange>(a, t, args, b, e);
}
void fixup_cpu(Act a, DType t, const FixupArgs& args, int64_t b, int64_t e) {
  dispatch<FixupRange>(a, t, args, b, e);
}

} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim
