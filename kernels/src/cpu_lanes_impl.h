//===- cpu_lanes_impl.h - fp32 lanes of the CPU loops (AVX2 / AVX-512) ----===//
//
// What: the per-lane fp32 code of cpu_loops_impl.h, written once with GCC vector extensions
// for 8 (AVX2) or 16 (AVX-512) lanes: derivative_tables.h's pieces from the saved output,
// the left tail apart, mask and hardswish backwards, the branch bits and keep-exactly flags
// (and AVX-512's unswitched mask loops). Empty below AVX2.
// Why: the SIMD half of the activation loops; included by cpu_loops_impl.h (after
// has_fast_inverse) inside namespace MEMSLIM_CPU_NS, whose forward_range / backward_range
// call it.
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

#if defined(__AVX2__)
// ---- fp32 lanes for the inverting activations (AVX2: 8, AVX-512: 16) -----
// GCC vector extensions, so one body serves both widths; the few operations
// they lack (sqrt, lane selection from a table) are per-width intrinsics.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));

MEMSLIM_HD vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
MEMSLIM_HD void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
MEMSLIM_HD vf vsqrt(vf v) {
#if defined(__AVX512F__)
  return vf(_mm512_sqrt_ps(__m512(v)));
#else
  return vf(_mm256_sqrt_ps(__m256(v)));
#endif
}
// Lane l of the result: table[idx[l]], idx in [0, kTablePieces): one vpermps
// over 8 entries (AVX2), one vpermt2ps over 32 (AVX-512).
#if defined(__AVX512F__)
constexpr int kTablePieces = 32;
MEMSLIM_HD vf vpermute(const float* table, vi idx) {
  return vf(
      _mm512_permutex2var_ps(_mm512_loadu_ps(table), __m512i(idx), _mm512_loadu_ps(table + 16)));
}
#else
constexpr int kTablePieces = 8;
MEMSLIM_HD vf vpermute(const float* table, vi idx) {
  return vf(_mm256_permutevar8x32_ps(_mm256_loadu_ps(table), __m256i(idx)));
}
#endif
// The same for a per-branch parameter (3 entries, padded to 8).
MEMSLIM_HD vf vpermute8(const float* table8, vi idx) {
#if defined(__AVX512F__)
  return vf(_mm512_permutexvar_ps(__m512i(idx), _mm512_broadcast_f32x8(_mm256_loadu_ps(table8))));
#else
  return vf(_mm256_permutevar8x32_ps(_mm256_loadu_ps(table8), __m256i(idx)));
#endif
}
MEMSLIM_HD uint32_t vmask(vi m) { // lane l's sign bit -> bit l
#if defined(__AVX512F__)
  return _mm512_movepi32_mask(__m512i(m));
#else
  return uint32_t(_mm256_movemask_ps(__m256(m)));
#endif
}
// Lanes from packed bits (kLanes / 8 bytes): all-ones where the bit is set.
MEMSLIM_HD vi vbits(const uint8_t* bits) {
  uint32_t word = 0;
  std::memcpy(&word, bits, kLanes / 8);
  vi lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = int32_t(1u << l);
  return ((vi{} + int32_t(word)) & lane) != 0;
}
MEMSLIM_HD vf vmin(vf a, vf b) { return b < a ? b : a; } // m::min / m::max, lane by lane
MEMSLIM_HD vf vmax(vf a, vf b) { return a < b ? b : a; }
MEMSLIM_HD vf vtrunc(vf v) { // toward zero, one instruction
#if defined(__AVX512F__)
  return vf(_mm512_roundscale_ps(__m512(v), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
#else
  return vf(_mm256_round_ps(__m256(v), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
#endif
}

// hd.h's fast_log, lane by lane: the same operations in the same order.
MEMSLIM_HD vf vfast_log(vf v) {
  const vi u = vi(v);
  vi e = ((u >> 23) & 0xff) - 127;
  vf mnt = vf((u & 0x7fffff) | 0x3f800000);
  const vi big = mnt > 1.41421356f;
  mnt = big ? mnt * 0.5f : mnt;
  e = e - big; // big lanes are -1: e + 1
  const vf z = (mnt - 1.f) / (mnt + 1.f);
  const vf z2 = z * z;
  const vf series =
      z * (2.f + z2 * (0.6666666667f + z2 * (0.4f + z2 * (0.2857142857f + z2 * 0.2222222222f))));
  return __builtin_convertvector(e, vf) * 0.69314718056f + series;
}

// derivative_from_table (activations.h) for U vectors of kLanes elements:
// each lane's branch picks its piece, one table lookup per coefficient
// (vpermps). The U Horner chains are interleaved: one chain is FMA-latency
// bound (4 cycles per coefficient), U of them fill the pipeline. NaN for a
// non-finite y, as derivative_by_inversion.
template <Act A, int U>
MEMSLIM_HD void table_derivative_lanes(const vf* y, const vi* right, vf* d) {
  using D = typename detail::DerivFor<A, kTablePieces>::type;
  static const float v0t[8] = {D::kV0Right, D::kV0Left, D::kV0Tail};
  static const float scalet[8] = {D::kScaleRight, D::kScaleLeft, D::kScaleTail};
  static const float piecest[8] = {D::kPiecesRight, D::kPiecesLeft, D::kPiecesTail};
  static const float baset[8] = {D::kBaseRight, D::kBaseLeft, D::kBaseTail};
  const float ys = float(detail::min_info<A>().y);
  const float ys_lo = float(detail::min_info<A>().y - double(ys));
  const vf zero = vf{};
  vf t[U], v[U], s[U], acc[U];
  vi tail[U], p[U];
  vi any_tail = vi{};
  for (int q = 0; q < U; ++q) {
    t[q] = vsqrt(vmax((y[q] - ys) - ys_lo, zero));
    tail[q] = ~right[q] & (y[q] > D::kLeftEnd);
    any_tail |= tail[q];
    v[q] = t[q];
  }
  if (vmask(any_tail)) { // on N(0, 1) inputs 2% of lanes
    for (int q = 0; q < U; ++q) {
      const vf w = vsqrt(vmax(-2.f * vfast_log(vmax(-y[q], zero + 1e-30f)), zero));
      v[q] = tail[q] ? w : t[q];
    }
  }
  for (int q = 0; q < U; ++q) {
    const vi b = (~right[q] & 1) + (tail[q] & 1); // right 0, left 1, tail 2
    const vf pieces = vpermute8(piecest, b);
    const vf u = vmin(vmax((v[q] - vpermute8(v0t, b)) * vpermute8(scalet, b), zero), pieces);
    const vf j = vmin(__builtin_convertvector(__builtin_convertvector(u, vi), vf), pieces - 1.f);
    s[q] = 2.f * (u - j) - 1.f;
    p[q] = __builtin_convertvector(vpermute8(baset, b) + j, vi);
    acc[q] = vpermute(D::kCoef + D::kPieces * D::kDegree, p[q]);
  }
  for (int k = D::kDegree - 1; k >= 0; --k)
    for (int q = 0; q < U; ++q) acc[q] = acc[q] * s[q] + vpermute(D::kCoef + D::kPieces * k, p[q]);
  for (int q = 0; q < U; ++q) {
    vf dq = tail[q] ? y[q] * acc[q] + 0.f : acc[q];
    dq = (right[q] & (y[q] > D::kRightEnd)) ? zero + 1.f : dq;
    dq = t[q] > 0.f ? dq : zero;
    const vi finite =
        vi(vf(vi(y[q]) & 0x7fffffff)) <= vi(vf{} + detail::iter_limits<float>::finite_max);
    d[q] = finite ? dq : zero + NAN;
  }
}

// The same without the left tail, for the main loop: the tail's lanes are
// returned in tail (their d is meaningless; table_derivatives evaluates them
// apart). With two branches whose variable starts at 0 (asserted), the piece
// is floor(t * scale) plus the left branch's base, picked by mask blends
// rather than table lookups, and a non-finite y turns d into NaN through
// y - y: ~40 vector operations per kLanes elements instead of ~50.
template <Act A, int U>
MEMSLIM_HD void table_main_lanes(const vf* y, const vi* right, vf* d, vi* tail) {
  using D = typename detail::DerivFor<A, kTablePieces>::type;
  static_assert(D::kV0Right == 0.f && D::kV0Left == 0.f && D::kBaseRight == 0.f,
                "table_main_lanes: the right and left variables start at 0, right at piece 0");
  const float ys = float(detail::min_info<A>().y);
  const float ys_lo = float(detail::min_info<A>().y - double(ys));
  const vf zero = vf{};
  vf t[U], s[U], acc[U];
  vi p[U];
  for (int q = 0; q < U; ++q) {
    t[q] = vsqrt(vmax((y[q] - ys) - ys_lo, zero));
    tail[q] = ~right[q] & (y[q] > D::kLeftEnd);
    const vf u = t[q] * (right[q] ? zero + D::kScaleRight : zero + D::kScaleLeft);
    const vf j =
        vmin(vtrunc(u), right[q] ? zero + (D::kPiecesRight - 1.f) : zero + (D::kPiecesLeft - 1.f));
    s[q] = 2.f * (u - j) - 1.f;
    p[q] = __builtin_convertvector(j, vi) + (right[q] ? vi{} : vi{} + int32_t(D::kBaseLeft));
    acc[q] = vpermute(D::kCoef + D::kPieces * D::kDegree, p[q]);
  }
  for (int k = D::kDegree - 1; k >= 0; --k)
    for (int q = 0; q < U; ++q) acc[q] = acc[q] * s[q] + vpermute(D::kCoef + D::kPieces * k, p[q]);
  for (int q = 0; q < U; ++q) {
    vf dq = (right[q] & (y[q] > D::kRightEnd)) ? zero + 1.f : acc[q];
    dq = t[q] > 0.f ? dq : zero;
    d[q] = dq + (y[q] - y[q]); // + 0 where y is finite, NaN where not
  }
}

#if defined(__AVX512F__) && defined(MEMSLIM_HAVE_LIBMVEC)
// ActMath<Gelu>::forward, 16 lanes, with libmvec's 8-lane erff twice (see
// simd_math.h: its 16-lane variant is not accurate enough); returns how many
// were done (n rounded down to 16).
inline int64_t gelu_forward_block(const float* __restrict x, float* __restrict y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vf xv = vload(x + i);
    const vf z = xv * 0.70710678118654752440f;
    const __m512 zz = __m512(z);
    const __m256 lo = _ZGVdN8v_erff(_mm512_castps512_ps256(zz));
    const __m256 hi = _ZGVdN8v_erff(_mm512_extractf32x8_ps(zz, 1));
    const vf e = vf(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
    vstore(y + i, xv * 0.5f * (1.f + e));
  }
  return i;
}
#endif

// The left tail's lanes at positions idx[0, n) (n <= kTailBatch) of y, d and
// grad, kLanes at a time: gathered, evaluated with every lane in the tail (the
// tail branch always taken), scattered back.
constexpr int kTailBatch = 256;
template <Act A>
void tail_derivatives(const float* __restrict y, const float* __restrict grad, float* __restrict d,
                      const int64_t* idx, int n) {
  for (int k = 0; k < n; k += kLanes) {
    const int m = n - k < kLanes ? n - k : kLanes;
    vf yv, dv;
    for (int l = 0; l < kLanes; ++l) yv[l] = y[idx[k + (l < m ? l : 0)]];
    const vi left{};
    table_derivative_lanes<A, 1>(&yv, &left, &dv);
    for (int l = 0; l < m; ++l) {
      const int64_t j = idx[k + l];
      d[j] = grad ? grad[j] * dv[l] : dv[l];
    }
  }
}

// Derivatives of elements [0, len) into d (grad == nullptr) or grad * d into
// d; returns how many were done (len rounded down to a whole block). The left
// tail (2% of N(0, 1) lanes for gelu: in half of the 64-lane blocks, an
// unpredictable branch) is collected by index and evaluated apart in batches.
template <Act A>
int64_t table_derivatives(const float* __restrict y, const uint8_t* __restrict bits,
                          const float* __restrict grad, float* __restrict d, int64_t len) {
  constexpr int U = 4; // interleaved chains: one is FMA-latency bound
  constexpr int64_t block = int64_t(U) * kLanes;
  int64_t tails[kTailBatch + block];
  int nt = 0;
  int64_t i = 0;
  for (; i + block <= len; i += block) {
    vf yv[U], dv[U];
    vi rv[U], tv[U];
    for (int q = 0; q < U; ++q) {
      yv[q] = vload(y + i + q * kLanes);
      rv[q] = vbits(bits + (i + q * kLanes) / 8);
    }
    table_main_lanes<A, U>(yv, rv, dv, tv);
    uint64_t tail_mask = 0;
    for (int q = 0; q < U; ++q) {
      vstore(d + i + q * kLanes, grad ? vload(grad + i + q * kLanes) * dv[q] : dv[q]);
      tail_mask |= uint64_t(vmask(tv[q])) << (q * kLanes);
    }
    for (; tail_mask; tail_mask &= tail_mask - 1) tails[nt++] = i + __builtin_ctzll(tail_mask);
    if (nt >= kTailBatch) {
      tail_derivatives<A>(y, grad, d, tails, nt);
      nt = 0;
    }
  }
  tail_derivatives<A>(y, grad, d, tails, nt);
  return i;
}

// Mask activations (relu, leaky_relu, hardsigmoid): grad_in = chain(grad,
// bit ? d1 : d0), d0 / d1 the two derivatives grad_from_output gives; chain
// selects 0 where the derivative is 0 (NaN grad_out stays 0, as aten).
template <Act A>
int64_t mask_backward_lanes(const uint8_t* __restrict bits, const float* __restrict grad,
                            float* __restrict gi, int64_t len, const ActParams& act) {
  const float d1 = ActMath<A>::grad_from_output(0.f, true, act);
  const float d0 = ActMath<A>::grad_from_output(0.f, false, act);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const vi b = vbits(bits + i / 8);
    const vf d = b ? vf{} + d1 : vf{} + d0;
    const vf gd = vload(grad + i) * d;
    vstore(gi + i, chain_selects_zero<A>() ? (d == 0.f ? vf{} : gd) : gd);
  }
  return i;
}

// ActMath<Hardswish>::grad_from_output and chain, lane by lane.
inline int64_t hardswish_backward_lanes(const float* __restrict y, const uint8_t* __restrict bits,
                                        const float* __restrict grad, float* __restrict gi,
                                        int64_t len) {
  int64_t i = 0;
  const vf zero = vf{};
#if defined(__AVX512F__)
  // The same with the bit straight into a mask register and masked
  // operations for the selects, sqrt(9 + 24y) / 6 by rsqrt14 and one Newton
  // step (~2 ulp).
  const __m512 z = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f), three = _mm512_set1_ps(3.f);
  const __m512 c9 = _mm512_set1_ps(9.f), c24 = _mm512_set1_ps(24.f), half = _mm512_set1_ps(0.5f);
  const __m512 sixth = _mm512_set1_ps(1.f / 6.f);
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  for (; i + 16 <= len; i += 16) {
    __mmask16 b;
    std::memcpy(&b, bits + i / 8, 2);
    const __m512 yv = _mm512_loadu_ps(y + i);
    const __m512 a = _mm512_max_ps(z, _mm512_fmadd_ps(yv, c24, c9)); // NaN passes
    const __m512 rs = _mm512_rsqrt14_ps(a);
    const __m512 sq = _mm512_mul_ps(a, rs);
    const __m512 e = _mm512_fnmadd_ps(sq, _mm512_mul_ps(half, rs), half);
    // a = 0 (r = inf): sqrt is 0; NaN stays NaN.
    const __m512 r = _mm512_mask_mul_ps(a, _mm512_cmp_ps_mask(a, z, _CMP_GT_OQ),
                                        _mm512_fmadd_ps(sq, e, sq), sixth);
    // right: y >= 3 ? 1 : r; left: -r, 0 where y is 0 or NaN.
    __m512 d = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(yv, three, _CMP_GE_OQ), one);
    d = _mm512_mask_xor_ps(d, b, r, _mm512_castsi512_ps(sign));
    const __mmask16 left_zero = _mm512_mask_cmp_ps_mask(b, yv, z, _CMP_EQ_UQ); // 0 or NaN
    d = _mm512_maskz_mov_ps(~left_zero, d);
    // grad * d, 0 where d is 0 (a NaN grad there too, as aten).
    const __m512 gd =
        _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(d, z, _CMP_NEQ_UQ), _mm512_loadu_ps(grad + i), d);
    _mm512_storeu_ps(gi + i, gd);
  }
#endif
  for (; i + kLanes <= len; i += kLanes) {
    const vf yv = vload(y + i);
    const vi b = vbits(bits + i / 8);
    const vf r = vsqrt(vmax(9.f + 24.f * yv, zero)) / 6.f;
    const vf left = ((yv == 0.f) | (yv != yv)) ? zero : -r;
    const vf right = yv >= 3.f ? zero + 1.f : r;
    const vf d = b ? left : right;
    const vf gd = vload(grad + i) * d;
    vstore(gi + i, d == 0.f ? zero : gd);
  }
  return i;
}

// The branch bit and the keep-exactly test of activations.h for fp32, lane by
// lane: InvertedAtMinimum's (gelu, gelu(tanh), silu, mish) and hardswish's.
template <Act A>
constexpr bool has_lane_flags() {
  return has_fast_inverse<A>() || A == Act::Hardswish || A == Act::Relu || A == Act::LeakyRelu ||
         A == Act::Hardsigmoid;
}

// Whether the fp32 flags must look past x: activation_dropout's output, saved
// scaled by 1/(1-p). hardswish then keeps its kink at 3 exactly; the others
// test the scaled output for overflow (an unscaled one cannot overflow: |f(x)|
// <= |x| for a finite x).
template <Act A>
MEMSLIM_HD bool output_scaled(const ActParams& act) {
  if constexpr (A == Act::Hardswish)
    return act.out_scale != 1.0;
  else
    return !(act.out_scale == 1.0 && act.out_max > double(detail::iter_limits<float>::finite_max));
}

template <Act A>
MEMSLIM_HD void lane_flags(vf x, const float* y, const ActParams& act, vi& bit, vi& exact,
                           bool want_exact) {
  const vf ax = vf(vi(x) & 0x7fffffff);
  if constexpr (A == Act::Relu) { // the masks' bit() lane by lane (no exact list)
    bit = ~(x <= 0.f);
  } else if constexpr (A == Act::LeakyRelu) {
    bit = x > 0.f;
  } else if constexpr (A == Act::Hardsigmoid) {
    bit = (x > -3.f) & (x < 3.f);
  } else if constexpr (A == Act::Hardswish) {
    bit = x < -1.5f;
    if (!want_exact) return;
    const vi band_in = vf(vi(x + 1.5f) & 0x7fffffff) < float(act.band);
    const vi kink = vf(vi(x - 3.f) & 0x7fffffff) < 0.05f;
    exact = output_scaled<A>(act) ? band_in | kink : band_in;
  } else {
    using L = detail::iter_limits<float>;
    const float xs = float(detail::min_info<A>().x);
    bit = ~(x < xs); // !(x < x*): NaN sets the bit, as bit()
    if (!want_exact) return;
    const vi fin = ax <= L::finite_max;
    const vi band_in = vf(vi(x - xs) & 0x7fffffff) < float(act.band);
    const vi big = (ax > L::huge) & fin;
    exact = band_in | big;
    if (!output_scaled<A>(act)) return;
    const vf sy = vload(y) * float(act.out_scale);
    exact |= (vf(vi(sy) & 0x7fffffff) >= float(act.out_max)) & fin;
  }
}

// Bits and exact list for elements [0, len) (a multiple of kLanes): the bit
// bytes straight from the compare mask, exact elements from their mask's set
// bits, in index order.
template <Act A>
void lane_flags_range(const float* __restrict x, const float* __restrict y, const ActParams& act,
                      int64_t len, uint8_t* __restrict bits, const ForwardParams<float>* ex,
                      int64_t c0) {
  for (int64_t i = 0; i < len; i += kLanes) {
    vi bit{}, exact{};
    lane_flags<A>(vload(x + i), y + i, act, bit, exact, ex != nullptr);
    if (bits) {
      const uint32_t m = vmask(bit);
      std::memcpy(bits + i / 8, &m, kLanes / 8);
    }
    if (!ex) continue;
    for (uint32_t m = vmask(exact); m; m &= m - 1) {
      const int64_t j = i + __builtin_ctz(m);
      push_exact(*ex, c0 + j, x[j]);
    }
  }
}

#if defined(__AVX512F__)
// lane_flags_range for the activations with an exact list (gelu, gelu(tanh),
// silu, mish, hardswish) on AVX-512, unswitched: one loop per (bits wanted,
// exact list wanted, output scaled), compares straight into mask registers,
// 64 elements a step (one 8-byte store of bits, one test of the exact mask).
// The generic loop above kept its loop-invariant tests and mask <-> vector
// moves inside the loop: ~12 us of gelu's forward at 100k elements.
template <Act A>
constexpr bool has_mask_flags() {
  return has_fast_inverse<A>() || A == Act::Hardswish;
}
// With Y (hardswish), the loop also writes y = x * min(max(x + 3, 0), 6) / 6
// (ActMath's operations and NaN choices: vmaxps(0, t) is max(t, 0) = t < 0 ? 0
// : t), so x is read once: the forward's second pass was ~5 of its 16 us.
template <Act A, bool Bits, bool Exact, bool Scaled, bool Y = false>
void mask_flags_range(const float* __restrict x, float* __restrict y, const ActParams& act,
                      int64_t len, uint8_t* __restrict bits, const ForwardParams<float>* ex,
                      int64_t c0) {
  static_assert(!Y || A == Act::Hardswish);
  using L = detail::iter_limits<float>;
  constexpr bool hs = A == Act::Hardswish;
  const __m512 center = _mm512_set1_ps(hs ? -1.5f : float(detail::min_info<A>().x));
  const __m512 band = _mm512_set1_ps(float(act.band));
  const __m512 huge = _mm512_set1_ps(L::huge), fmax = _mm512_set1_ps(L::finite_max);
  const __m512 scale = _mm512_set1_ps(float(act.out_scale));
  const __m512 omax = _mm512_set1_ps(float(act.out_max));
  const __m512 three = _mm512_set1_ps(3.f), kink = _mm512_set1_ps(0.05f);
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.f);
  for (int64_t i = 0; i < len; i += 64) {
    uint64_t bit_mask = 0, exact_mask = 0;
    for (int q = 0; q < 4; ++q) {
      const __m512 xv = _mm512_loadu_ps(x + i + 16 * q);
      if constexpr (Y) {
        const __m512 t = _mm512_min_ps(six, _mm512_max_ps(zero, _mm512_add_ps(xv, three)));
        _mm512_storeu_ps(y + i + 16 * q, _mm512_div_ps(_mm512_mul_ps(xv, t), six));
      }
      // hardswish: x < -1.5; the others: !(x < x*) (NaN sets it, as bit()).
      const __mmask16 b = _mm512_cmp_ps_mask(xv, center, hs ? _CMP_LT_OQ : _CMP_NLT_UQ);
      bit_mask |= uint64_t(b) << (16 * q);
      if constexpr (Exact) {
        __mmask16 e =
            _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(xv, center)), band, _CMP_LT_OQ);
        if constexpr (hs) {
          if constexpr (Scaled)
            e |= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(xv, three)), kink, _CMP_LT_OQ);
        } else {
          const __m512 ax = _mm512_abs_ps(xv);
          const __mmask16 fin = _mm512_cmp_ps_mask(ax, fmax, _CMP_LE_OQ);
          e |= _mm512_mask_cmp_ps_mask(fin, ax, huge, _CMP_GT_OQ);
          if constexpr (Scaled) {
            const __m512 sy = _mm512_abs_ps(_mm512_mul_ps(_mm512_loadu_ps(y + i + 16 * q), scale));
            e |= _mm512_mask_cmp_ps_mask(fin, sy, omax, _CMP_GE_OQ);
          }
        }
        exact_mask |= uint64_t(e) << (16 * q);
      }
    }
    if constexpr (Bits) std::memcpy(bits + i / 8, &bit_mask, 8);
    for (; Exact && exact_mask; exact_mask &= exact_mask - 1) {
      const int64_t j = i + __builtin_ctzll(exact_mask);
      push_exact(*ex, c0 + j, x[j]);
    }
  }
}
// Picks the instance; false where lane_flags_range is to run instead.
// hardswish's instances compute y too (forward_range calls them before its
// own y loop).
template <Act A>
bool mask_flags(const float* x, float* y, const ActParams& act, int64_t len, uint8_t* bits,
                const ForwardParams<float>* ex, int64_t c0) {
  if constexpr (!has_mask_flags<A>()) {
    return false;
  } else {
    const bool scaled = output_scaled<A>(act);
    constexpr bool hs = A == Act::Hardswish;
#define MEMSLIM_MASK_FLAGS(B, E, SC)                                  \
  if ((bits != nullptr) == B && (ex != nullptr) == E && scaled == SC) \
    return mask_flags_range<A, B, E, SC, hs>(x, y, act, len, bits, ex, c0), true;
    MEMSLIM_MASK_FLAGS(true, true, false)
    MEMSLIM_MASK_FLAGS(true, true, true)
    MEMSLIM_MASK_FLAGS(true, false, false)
    MEMSLIM_MASK_FLAGS(true, false, true)
    MEMSLIM_MASK_FLAGS(false, true, false)
    MEMSLIM_MASK_FLAGS(false, true, true)
#undef MEMSLIM_MASK_FLAGS
    return false;
  }
}
#endif
#endif

} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim
