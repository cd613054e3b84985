//===- hd.h - host+device helpers shared by the CPU loops and CUDA kernels -===//
//
// What: the MEMSLIM_HD qualifier, math wrappers overloaded for float/double,
// 16-bit storage conversions (IEEE half and bfloat16 held as uint16_t), an
// atomic add and a slot reservation (warp-aggregated on the device) that work
// on both sides, and the compute type for each storage type. Why: kernels/
// carries no torch, so everything a kernel body needs to run unchanged on the
// host and on the device lives here.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__CUDACC__)
#include <cooperative_groups.h>
#include <cooperative_groups/scan.h>
#endif
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#if defined(__CUDACC__)
#define MEMSLIM_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
// Always inlined on the host too: the CPU loops vectorise only what is
// inlined into them (a call to the per-element math keeps a loop scalar).
#define MEMSLIM_HD inline __attribute__((always_inline))
#else
#define MEMSLIM_HD inline
#endif

// Full unrolling of a constant-trip loop on the device, so that arrays indexed
// by its counter stay in registers (not local memory); nothing on the host.
#if defined(__CUDACC__)
#define MEMSLIM_UNROLL _Pragma("unroll")
#else
#define MEMSLIM_UNROLL
#endif

namespace memslim {
namespace kernels {

// 16-bit storage types. They are plain uint16_t wrappers so the same bytes
// torch keeps in c10::Half / c10::BFloat16 can be passed as raw pointers.
struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

// Arithmetic is done in float for 16-bit and float storage, double for double.
template <typename S>
struct compute_type {
  using type = float;
};
template <>
struct compute_type<double> {
  using type = double;
};

namespace m {
MEMSLIM_HD float exp(float x) { return ::expf(x); }
MEMSLIM_HD double exp(double x) { return ::exp(x); }
MEMSLIM_HD float expm1(float x) { return ::expm1f(x); }
MEMSLIM_HD double expm1(double x) { return ::expm1(x); }
MEMSLIM_HD float log(float x) { return ::logf(x); }
MEMSLIM_HD double log(double x) { return ::log(x); }
MEMSLIM_HD float log1p(float x) { return ::log1pf(x); }
MEMSLIM_HD double log1p(double x) { return ::log1p(x); }
MEMSLIM_HD float erf(float x) { return ::erff(x); }
MEMSLIM_HD double erf(double x) { return ::erf(x); }
MEMSLIM_HD float erfc(float x) { return ::erfcf(x); }
MEMSLIM_HD double erfc(double x) { return ::erfc(x); }
MEMSLIM_HD float tanh(float x) { return ::tanhf(x); }
MEMSLIM_HD double tanh(double x) { return ::tanh(x); }
MEMSLIM_HD float sqrt(float x) { return ::sqrtf(x); }
MEMSLIM_HD double sqrt(double x) { return ::sqrt(x); }
MEMSLIM_HD float fabs(float x) { return ::fabsf(x); }
MEMSLIM_HD double fabs(double x) { return ::fabs(x); }
MEMSLIM_HD float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
MEMSLIM_HD double fma(double a, double b, double c) { return ::fma(a, b, c); }
template <typename T>
MEMSLIM_HD T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
MEMSLIM_HD T max(T a, T b) {
  return a < b ? b : a;
}
template <typename T>
MEMSLIM_HD bool isnan(T x) {
  return x != x;
}
template <typename T>
MEMSLIM_HD bool isinf(T x) {
  return fabs(x) == T(INFINITY);
}
} // namespace m

// ---- 16-bit conversions (round to nearest even, NaN kept quiet) ----------
MEMSLIM_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
MEMSLIM_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MEMSLIM_HD float to_float(bf16_t v) { return bits_to_float(uint32_t(v.bits) << 16); }
MEMSLIM_HD bf16_t to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}

MEMSLIM_HD float to_float(half_t v) {
  // Branch-free (vectorises): the 15 magnitude bits shifted into a float's
  // exponent/mantissa give the value times 2^-112 for normals and subnormals
  // alike; scaling by 2^112 is exact. Inf/NaN keep an all-ones exponent.
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const float scaled = bits_to_float(em << 13) * 5.192296858534828e+33f; // 2^112
  const uint32_t finite = float_to_bits(scaled);
  const uint32_t special = (em << 13) | 0x7f800000u;
  return bits_to_float(sign | (em >= 0x7c00u ? special : finite));
}
MEMSLIM_HD half_t to_half(float f) {
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
  // The CPU loops' AVX2 / AVX-512 builds: the F16C instruction rounds to
  // nearest even exactly as the code below (subnormals included); a NaN keeps
  // the canonical quiet pattern the code below gives.
  const uint16_t hw = uint16_t(_cvtss_sh(f, 0));
  return half_t{f != f ? uint16_t((hw & 0x8000u) | 0x7e00u) : hw};
#else
  uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return half_t{uint16_t(sign | 0x7e00u)};  // NaN
  if (u >= 0x477ff000u) return half_t{uint16_t(sign | 0x7c00u)}; // overflow -> inf
  if (u < 0x38800000u) {
    // Result is subnormal (or zero): round f * 2^24 to an integer, ties to even.
    float a = bits_to_float(u) * 16777216.0f;
    uint32_t r = uint32_t(a);
    float frac = a - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return half_t{uint16_t(sign | r)};
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits.
  uint32_t e = ((u >> 23) - 112u) << 10;
  uint32_t man = u & 0x7fffffu;
  uint32_t h = e | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return half_t{uint16_t(sign | h)};
#endif
}

// Natural log for positive normal floats, to ~2e-7 relative: exponent from the
// bits, log2 of the mantissa in [sqrt(1/2), sqrt(2)) by a short series in
// (m-1)/(m+1). Branch-free, so it vectorises without libmvec's special-case
// fallbacks; used only to form a first guess, never a result.
MEMSLIM_HD float fast_log(float v) {
  uint32_t u = float_to_bits(v);
  int32_t e = int32_t((u >> 23) & 0xffu) - 127;
  float mnt = bits_to_float((u & 0x7fffffu) | 0x3f800000u); // [1, 2)
  const bool big = mnt > 1.41421356f;
  mnt = big ? mnt * 0.5f : mnt;
  e = big ? e + 1 : e;
  const float z = (mnt - 1.f) / (mnt + 1.f); // |z| <= 0.172
  const float z2 = z * z;
  const float series =
      z * (2.f + z2 * (0.6666666667f + z2 * (0.4f + z2 * (0.2857142857f + z2 * 0.2222222222f))));
  return float(e) * 0.69314718056f + series;
}
MEMSLIM_HD double fast_log(double v) { return ::log(v); }

// Load/store between storage and compute type.
template <typename C>
MEMSLIM_HD C load(float v) {
  return C(v);
}
template <typename C>
MEMSLIM_HD C load(double v) {
  return C(v);
}
template <typename C>
MEMSLIM_HD C load(half_t v) {
  return C(to_float(v));
}
template <typename C>
MEMSLIM_HD C load(bf16_t v) {
  return C(to_float(v));
}
template <typename S>
struct store_to;
template <>
struct store_to<float> {
  template <typename C>
  MEMSLIM_HD static float cvt(C v) {
    return float(v);
  }
};
template <>
struct store_to<double> {
  template <typename C>
  MEMSLIM_HD static double cvt(C v) {
    return double(v);
  }
};
template <>
struct store_to<half_t> {
  template <typename C>
  MEMSLIM_HD static half_t cvt(C v) {
    return to_half(float(v));
  }
};
template <>
struct store_to<bf16_t> {
  template <typename C>
  MEMSLIM_HD static bf16_t cvt(C v) {
    return to_bf16(float(v));
  }
};
template <typename S, typename C>
MEMSLIM_HD S store(C v) {
  return store_to<S>::cvt(v);
}

// Relaxed atomic add on a 64-bit counter: atomicAdd on the device, the GCC
// builtin on the host (the CPU loops run in torch's thread pool).
MEMSLIM_HD unsigned long long atomic_add(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

MEMSLIM_HD int popcount32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

// Reserves `k` consecutive slots of a list whose length is `*count`; returns
// the first. On the device the threads calling it together (a converged warp)
// add their k's with one atomic: an exclusive scan over the coalesced group,
// the last thread adds the total, and its old value is broadcast (same-address
// atomics serialise in L2; per element they cost more than the bytes, issue
// 13's GPU run of 2026-11-30). On the host, one relaxed atomic when k > 0.
MEMSLIM_HD unsigned long long reserve_slots(unsigned long long* count, unsigned k) {
#if defined(__CUDA_ARCH__)
  namespace cg = cooperative_groups;
  const cg::coalesced_group g = cg::coalesced_threads();
  const unsigned before = cg::exclusive_scan(g, k);
  const unsigned last = g.size() - 1;
  unsigned long long base = 0;
  if (g.thread_rank() == last && before + k != 0)
    base = atomicAdd(count, (unsigned long long)(before + k));
  return g.shfl(base, last) + before;
#else
  return k != 0 ? atomic_add(count, k) : 0ull;
#endif
}

} // namespace kernels
} // namespace memslim
