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
#include <type_traits>

#include "simd_math.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "memslim/kernels/dispatch.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {

constexpr int64_t kChunk = 512;  // elements per pass; a multiple of 8

constexpr float iter_limits_float_max() { return detail::iter_limits<float>::finite_max; }

// The activations whose fp32 backward evaluates derivative_tables.h.
template <Act A> constexpr bool has_fast_inverse() {
  return A == Act::Gelu || A == Act::GeluTanh || A == Act::Silu || A == Act::Mish;
}

#if defined(__AVX2__)
// InvertedAtMinimum's bit and exact (activations.h), 8 fp32 lanes at a time:
// the bit byte straight from movemask, exact elements from their mask's set
// bits, in index order. `len` a multiple of 8.
template <Act A>
void inverted_flags8(const float* __restrict x, const float* __restrict y, const ActParams& act,
                     int64_t len, uint8_t* __restrict bits, const ForwardParams<float>* ex,
                     int64_t c0) {
  using L = detail::iter_limits<float>;
  const __m256 xs = _mm256_set1_ps(float(detail::min_info<A>().x));
  const __m256 band = _mm256_set1_ps(float(act.band));
  const __m256 huge = _mm256_set1_ps(L::huge), fmax = _mm256_set1_ps(L::finite_max);
  const __m256 scale = _mm256_set1_ps(float(act.out_scale)),
               out_max = _mm256_set1_ps(float(act.out_max));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < len; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    if (bits) bits[i / 8] = uint8_t(_mm256_movemask_ps(_mm256_cmp_ps(xv, xs, _CMP_NLT_UQ)));
    if (!ex) continue;
    const __m256 ax = _mm256_and_ps(xv, abs_mask);
    const __m256 fin = _mm256_cmp_ps(ax, fmax, _CMP_LE_OQ);
    const __m256 band_in =
        _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(xv, xs), abs_mask), band, _CMP_LT_OQ);
    const __m256 big = _mm256_and_ps(_mm256_cmp_ps(ax, huge, _CMP_GT_OQ), fin);
    const __m256 ovf = _mm256_and_ps(
        _mm256_cmp_ps(_mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(y + i), scale), abs_mask),
                      out_max, _CMP_GE_OQ),
        fin);
    for (uint32_t m = uint32_t(_mm256_movemask_ps(_mm256_or_ps(band_in, _mm256_or_ps(big, ovf))));
         m; m &= m - 1) {
      const int64_t j = i + __builtin_ctz(m);
      const unsigned long long k = atomic_add(ex->exact_count, 1ull);
      if (int64_t(k) < ex->exact_cap) {
        ex->exact_idx[k] = int32_t(c0 + j);
        ex->exact_val[k] = x[j];
      }
    }
  }
}
#endif

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
    // One pass of flags per element, bit 0 the branch bit and bit 1 "keep
    // exactly" (decided from x and the output as stored: elu keeps overflowed
    // ones), then 32 flags at a time: movemask packs the bits, and the exact
    // elements (0.1% on N(0, 1) inputs) are found by their set bits.
    const bool want_bits = p.bits != nullptr, want_exact = p.exact_idx != nullptr;
    if (!want_bits && !want_exact) continue;
#if defined(__AVX2__)
    if constexpr (has_fast_inverse<A>() && std::is_same_v<S, float>) {
      if (p.y && len == kChunk) {
        inverted_flags8<A>(xv, p.y + c0, act, len, want_bits ? p.bits + c0 / 8 : nullptr,
                           want_exact ? &p : nullptr, c0);
        continue;
      }
    }
#endif
    if (want_exact && p.y) {
      for (int64_t i = 0; i < len; ++i)
        bv[i] = (ActMath<A>::bit(xv[i], act) ? 1 : 0) |
                (ActMath<A>::exact(xv[i], load<C>(p.y[c0 + i]), act) ? 2 : 0);
    } else if (want_exact) {
      for (int64_t i = 0; i < len; ++i) {
        const C yi = load<C>(store<S>(ActMath<A>::forward(xv[i], act)));
        bv[i] = (ActMath<A>::bit(xv[i], act) ? 1 : 0) | (ActMath<A>::exact(xv[i], yi, act) ? 2 : 0);
      }
    } else {
      for (int64_t i = 0; i < len; ++i) bv[i] = ActMath<A>::bit(xv[i], act) ? 1 : 0;
    }
    const int64_t padded = (len + 31) & ~int64_t(31);
    for (int64_t i = len; i < padded; ++i) bv[i] = 0;
    uint8_t* __restrict bits = want_bits ? p.bits + c0 / 8 : nullptr;
    const int64_t groups = (len + 7) / 8;
    for (int64_t b0 = 0; b0 < padded; b0 += 32) {
      uint32_t bit_mask = 0, exact_mask = 0;
#if defined(__AVX2__)
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bv + b0));
      bit_mask = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(v, 7)));
      exact_mask = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(v, 6)));
#else
      for (int j = 0; j < 32; ++j) {
        bit_mask |= uint32_t(bv[b0 + j] & 1u) << j;
        exact_mask |= uint32_t((bv[b0 + j] >> 1) & 1u) << j;
      }
#endif
      if (want_bits) {
        // bit i = element i, little-endian: byte k = elements 8k..8k+7.
        for (int k = 0; k < 4 && b0 / 8 + k < groups; ++k)
          bits[b0 / 8 + k] = uint8_t(bit_mask >> (8 * k));
      }
      for (; want_exact && exact_mask; exact_mask &= exact_mask - 1) {
        const int64_t i = b0 + __builtin_ctz(exact_mask);
        const unsigned long long k = atomic_add(p.exact_count, 1ull);
        if (int64_t(k) < p.exact_cap) {
          p.exact_idx[k] = int32_t(c0 + i);
          p.exact_val[k] = x[i];
        }
      }
    }
  }
}

#if defined(__AVX2__)
// hd.h's fast_log, 8 lanes: the same operations in the same order.
inline __m256 fast_log8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  __m256i e = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(0xff)),
                               _mm256_set1_epi32(127));
  __m256 mnt = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffff)),
                                                   _mm256_set1_epi32(0x3f800000)));
  const __m256 big = _mm256_cmp_ps(mnt, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  mnt = _mm256_blendv_ps(mnt, _mm256_mul_ps(mnt, _mm256_set1_ps(0.5f)), big);
  e = _mm256_sub_epi32(e, _mm256_castps_si256(big)); // big lanes are -1: e + 1
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 z = _mm256_div_ps(_mm256_sub_ps(mnt, one), _mm256_add_ps(mnt, one));
  const __m256 z2 = _mm256_mul_ps(z, z);
  __m256 q = _mm256_fmadd_ps(z2, _mm256_set1_ps(0.2222222222f), _mm256_set1_ps(0.2857142857f));
  q = _mm256_fmadd_ps(z2, q, _mm256_set1_ps(0.4f));
  q = _mm256_fmadd_ps(z2, q, _mm256_set1_ps(0.6666666667f));
  q = _mm256_fmadd_ps(z2, q, _mm256_set1_ps(2.f));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_set1_ps(0.69314718056f),
                         _mm256_mul_ps(z, q));
}

// derivative_from_table (activations.h), 8 lanes at a time: the branch picks
// each lane's piece, one vpermps per coefficient reads it from the 8-entry
// table row. NaN for a non-finite y, as derivative_by_inversion. `bits`: the
// packed branch bits of elements [0, len); returns how many were done (len
// rounded down to 8); the caller does the rest one by one.
template <Act A>
int64_t table_derivatives8(const float* __restrict y, const uint8_t* __restrict bits,
                           float* __restrict d, int64_t len) {
  using D = typename detail::DerivFor<A>::type;
  static_assert(tables::kPieces == 8, "one vpermps selects among 8 pieces");
  __m256 coef[D::kDegree + 1];
  for (int k = 0; k <= D::kDegree; ++k) coef[k] = _mm256_loadu_ps(D::kCoef + 8 * k);
  const __m256 v0t = _mm256_setr_ps(D::kV0Right, D::kV0Left, D::kV0Tail, 0, 0, 0, 0, 0);
  const __m256 scalet = _mm256_setr_ps(D::kScaleRight, D::kScaleLeft, D::kScaleTail, 0, 0, 0, 0, 0);
  const __m256 piecest =
      _mm256_setr_ps(D::kPiecesRight, D::kPiecesLeft, D::kPiecesTail, 0, 0, 0, 0, 0);
  const __m256 baset = _mm256_setr_ps(D::kBaseRight, D::kBaseLeft, D::kBaseTail, 0, 0, 0, 0, 0);
  const float ys1 = float(detail::min_info<A>().y);
  const __m256 ys = _mm256_set1_ps(ys1);
  const __m256 ys_lo = _mm256_set1_ps(float(detail::min_info<A>().y - double(ys1)));
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f), two = _mm256_set1_ps(2.f);
  const __m256 left_end = _mm256_set1_ps(D::kLeftEnd), right_end = _mm256_set1_ps(D::kRightEnd);
  const __m256 fmax = _mm256_set1_ps(iter_limits_float_max());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 yv = _mm256_loadu_ps(y + i);
    const __m256i byte = _mm256_set1_epi32(bits[i / 8]);
    const __m256 right =
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit));
    const __m256 t =
        _mm256_sqrt_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_sub_ps(yv, ys), ys_lo), zero));
    const __m256 tail = _mm256_andnot_ps(right, _mm256_cmp_ps(yv, left_end, _CMP_GT_OQ));
    // Branch index: right 0, left 1, tail 2.
    __m256i b = _mm256_andnot_si256(_mm256_castps_si256(right), _mm256_set1_epi32(1));
    b = _mm256_add_epi32(b, _mm256_and_si256(_mm256_castps_si256(tail), _mm256_set1_epi32(1)));
    __m256 v = t;
    if (_mm256_movemask_ps(tail)) { // ~1 vector in 6 on N(0, 1) inputs
      const __m256 ny = _mm256_max_ps(_mm256_sub_ps(zero, yv), _mm256_set1_ps(1e-30f));
      const __m256 w =
          _mm256_sqrt_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_set1_ps(-2.f), fast_log8(ny)), zero));
      v = _mm256_blendv_ps(t, w, tail);
    }
    const __m256 pieces = _mm256_permutevar8x32_ps(piecest, b);
    const __m256 u = _mm256_min_ps(
        _mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(v, _mm256_permutevar8x32_ps(v0t, b)),
                                    _mm256_permutevar8x32_ps(scalet, b)),
                      zero),
        pieces);
    const __m256 j =
        _mm256_min_ps(_mm256_cvtepi32_ps(_mm256_cvttps_epi32(u)), _mm256_sub_ps(pieces, one));
    const __m256 s = _mm256_sub_ps(_mm256_mul_ps(two, _mm256_sub_ps(u, j)), one);
    const __m256i p = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_permutevar8x32_ps(baset, b), j));
    __m256 acc = _mm256_permutevar8x32_ps(coef[D::kDegree], p);
    for (int k = D::kDegree - 1; k >= 0; --k)
      acc = _mm256_fmadd_ps(acc, s, _mm256_permutevar8x32_ps(coef[k], p));
    __m256 dv = _mm256_blendv_ps(acc, _mm256_add_ps(_mm256_mul_ps(yv, acc), zero), tail);
    dv = _mm256_blendv_ps(dv, one, _mm256_and_ps(right, _mm256_cmp_ps(yv, right_end, _CMP_GT_OQ)));
    dv = _mm256_and_ps(dv, _mm256_cmp_ps(t, zero, _CMP_GT_OQ));
    const __m256 bad = _mm256_cmp_ps(_mm256_and_ps(yv, abs_mask), fmax, _CMP_NLE_UQ);
    dv = _mm256_blendv_ps(dv, _mm256_set1_ps(NAN), bad);
    _mm256_storeu_ps(d + i, dv);
  }
  return i;
}
#endif

template <Act A, typename S>
void backward_range(const BackwardParams<S>& p, int64_t gb, int64_t ge) {
  using C = typename compute_type<S>::type;
  const int64_t begin = gb * 8;
  const int64_t end = ge * 8 < p.n ? ge * 8 : p.n;
  const ActParams act = p.act;  // see forward_range
  C yv[kChunk], dv[kChunk];
  unsigned char bv[kChunk]; // bytes, not bool: GCC vectorises these
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t len = end - c0 < kChunk ? end - c0 : kChunk;
    if (p.y) {
      for (int64_t i = 0; i < len; ++i) yv[i] = load<C>(p.y[c0 + i]);
    } else {
      for (int64_t i = 0; i < len; ++i) yv[i] = C(0);
    }
    int64_t done = 0;
#if defined(__AVX2__)
    if constexpr (has_fast_inverse<A>() && sizeof(C) == sizeof(float))
      done = table_derivatives8<A>(yv, p.bits + c0 / 8, dv, len);
#endif
    if (done < len) {
      if (p.bits) {
        const uint8_t* bits = p.bits + c0 / 8;
        for (int64_t g = done / 8; g < (len + 7) / 8; ++g) {
          const unsigned byte = bits[g];
          for (int j = 0; j < 8; ++j) bv[8 * g + j] = (byte >> j) & 1u;
        }
      } else {
        for (int64_t i = done; i < len; ++i) bv[i] = 0;
      }
      for (int64_t i = done; i < len; ++i)
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
