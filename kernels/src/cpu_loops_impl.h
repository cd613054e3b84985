//===- cpu_loops_impl.h - CPU loops over element ranges (one ISA per TU) ----===//
//
// What: the CPU forward / backward / fix-up loops. They use the very per-element
// math of activations.h that the CUDA bodies use, but are laid out for SIMD:
// each range is cut into L1-sized chunks, and each chunk goes through separate
// straight-line passes (outputs; one pass of bit / keep-exactly flags) so GCC
// vectorises the math with libmvec. fp32 backwards are one pass from the saved
// output, bits and grad; the per-lane code (derivative tables, flags, masks) is
// written once with GCC vector extensions for 8 (AVX2) or 16 (AVX-512) lanes.
// Included by cpu_loops.cpp (baseline x86-64), cpu_loops_avx2.cpp (AVX2+FMA+F16C)
// and cpu_loops_avx512.cpp inside namespace MEMSLIM_CPU_NS; cpu_dispatch.cpp
// picks one at run time.
//
//===----------------------------------------------------------------------===//
#include <cmath>
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

constexpr int64_t kChunk = 512; // elements per pass; a multiple of 8

// Storage <-> compute type for a block. 16-bit storage converts 8 at a time
// with F16C where the build has it (hd.h's to_half / to_float element by
// element were the slowest part of the fp16 loops: not vectorised).
template <typename S, typename C>
void load_block(const S* __restrict src, C* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<S, half_t>) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = load<C>(src[i]);
}
template <typename S, typename C>
void store_block(const C* __restrict src, S* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<S, half_t>) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(src + i);
      __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
      // NaN: the canonical quiet pattern, as to_half.
      const __m128i nan = _mm_packs_epi32(
          _mm256_castsi256_si128(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))),
          _mm256_extracti128_si256(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)), 1));
      const __m128i canon =
          _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(int16_t(0x8000))), _mm_set1_epi16(0x7e00));
      h = _mm_blendv_epi8(h, canon, nan);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
  }
#endif
  for (; i < n; ++i) dst[i] = store<S>(src[i]);
}

// The activations whose fp32 backward evaluates derivative_tables.h.
template <Act A>
constexpr bool has_fast_inverse() {
  return A == Act::Gelu || A == Act::GeluTanh || A == Act::Silu || A == Act::Mish;
}

} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim

// The fp32 lanes (AVX2 / AVX-512) the loops below use.
#include "cpu_lanes_impl.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {

template <Act A, typename S>
void forward_range(const ForwardParams<S>& p, int64_t gb, int64_t ge) {
  using C = typename compute_type<S>::type;
  const int64_t begin = gb * 8;
  const int64_t end = ge * 8 < p.n ? ge * 8 : p.n;
  // A local copy: parameter loads inside a select (x > 0 ? x : x * slope) are
  // then plain register reads the vectoriser may speculate.
  const ActParams act = p.act;
  C xbuf[std::is_same_v<S, C> ? 1 : kChunk]; // compute-type copy, 16-bit storage only
  unsigned char bv[kChunk];
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t len = end - c0 < kChunk ? end - c0 : kChunk;
    const S* __restrict x = p.x + c0;
    const C* __restrict xv;
    if constexpr (std::is_same_v<S, C>) {
      xv = x;
    } else {
      load_block<S, C>(x, xbuf, len);
      xv = xbuf;
    }
    const bool want_bits = p.bits != nullptr, want_exact = p.exact_idx != nullptr;
#if defined(__AVX512F__)
    if constexpr (A == Act::Hardswish && std::is_same_v<S, float>) {
      if (p.y && len == kChunk && (want_bits || want_exact) &&
          mask_flags<A>(xv, p.y + c0, act, len, want_bits ? p.bits + c0 / 8 : nullptr,
                        want_exact ? &p : nullptr, c0))
        continue;
    }
#endif
    if (p.y) {
      // Outputs in the compute type: straight into y, or (16-bit) a chunk
      // buffer stored in one block.
      S* __restrict y = p.y + c0;
      C ybuf[std::is_same_v<S, C> ? 1 : kChunk];
      C* __restrict yc;
      if constexpr (std::is_same_v<S, C>)
        yc = y;
      else
        yc = ybuf;
      int64_t i = 0;
#if defined(__AVX512F__) && defined(MEMSLIM_HAVE_LIBMVEC)
      if constexpr (A == Act::Gelu && std::is_same_v<C, float>) i = gelu_forward_block(xv, yc, len);
#endif
      for (; i < len; ++i) yc[i] = ActMath<A>::forward(xv[i], act);
      if constexpr (!std::is_same_v<S, C>) store_block<S, C>(ybuf, y, len);
    }
    // One pass of flags per element, bit 0 the branch bit and bit 1 "keep
    // exactly" (decided from x and the output as stored: elu keeps overflowed
    // ones), then 32 flags at a time: movemask packs the bits, and the exact
    // elements (0.1% on N(0, 1) inputs) are found by their set bits.
    if (!want_bits && !want_exact) continue;
#if defined(__AVX2__)
    if constexpr (has_lane_flags<A>() && std::is_same_v<S, float>) {
      if (p.y && len == kChunk) {
        uint8_t* bits = want_bits ? p.bits + c0 / 8 : nullptr;
        const ForwardParams<float>* ex = want_exact ? &p : nullptr;
#if defined(__AVX512F__)
        if (mask_flags<A>(xv, p.y + c0, act, len, bits, ex, c0)) continue;
#endif
        lane_flags_range<A>(xv, p.y + c0, act, len, bits, ex, c0);
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
        push_exact(p, c0 + i, x[i]);
      }
    }
  }
}

template <Act A, typename S>
void backward_range(const BackwardParams<S>& p, int64_t gb, int64_t ge) {
  using C = typename compute_type<S>::type;
  int64_t begin = gb * 8;
  const int64_t end = ge * 8 < p.n ? ge * 8 : p.n;
  const ActParams act = p.act; // see forward_range
#if defined(__AVX2__)
  // fp32 storage: one pass from y, bits and grad to grad_in; the chunks below
  // take what is left (fewer than kLanes elements).
  if constexpr (has_fast_inverse<A>() && std::is_same_v<S, float>) {
    if (p.y && p.bits)
      begin += table_derivatives<A>(p.y + begin, p.bits + begin / 8, p.grad + begin,
                                    p.grad_in + begin, end - begin);
  }
  if constexpr (A == Act::Hardswish && std::is_same_v<S, float>) {
    if (p.y && p.bits)
      begin += hardswish_backward_lanes(p.y + begin, p.bits + begin / 8, p.grad + begin,
                                        p.grad_in + begin, end - begin);
  }
  // A mask: the derivative is one of two constants, picked by the bit.
  if constexpr (save_kind(A) == SaveKind::Mask && std::is_same_v<S, float>) {
    if (p.bits)
      begin += mask_backward_lanes<A>(p.bits + begin / 8, p.grad + begin, p.grad_in + begin,
                                      end - begin, act);
  }
#endif
  // Storage in the compute type and no bit: one pass, the derivative from y.
  if constexpr (std::is_same_v<S, C> && !has_fast_inverse<A>()) {
    if (!p.bits && p.y) {
      const S* __restrict y = p.y;
      const S* __restrict g = p.grad;
      S* __restrict gi = p.grad_in;
      for (int64_t i = begin; i < end; ++i)
        gi[i] = chain<A, C>(g[i], ActMath<A>::grad_from_output(y[i], false, act));
      return;
    }
  }
  C yv[kChunk], dv[kChunk];
  unsigned char bv[kChunk]; // bytes, not bool: GCC vectorises these
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t len = end - c0 < kChunk ? end - c0 : kChunk;
    if (p.y) {
      load_block<S, C>(p.y + c0, yv, len);
    } else {
      for (int64_t i = 0; i < len; ++i) yv[i] = C(0);
    }
    int64_t done = 0;
#if defined(__AVX2__)
    if constexpr (has_fast_inverse<A>() && sizeof(C) == sizeof(float))
      done = table_derivatives<A>(yv, p.bits + c0 / 8, nullptr, dv, len);
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
    if constexpr (std::is_same_v<S, C>) {
      for (int64_t i = 0; i < len; ++i) gi[i] = chain<A, C>(g[i], dv[i]);
    } else {
      C gbuf[kChunk];
      load_block<S, C>(g, gbuf, len);
      for (int64_t i = 0; i < len; ++i) gbuf[i] = chain<A, C>(gbuf[i], dv[i]);
      store_block<S, C>(gbuf, gi, len);
    }
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

// The joins' and gelu's recompute loops.
#include "cpu_joins_impl.h"
