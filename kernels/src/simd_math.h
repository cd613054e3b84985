//===- simd_math.h - libmvec vector variants for the CPU loops --------------===//
//
// What: re-declares the libm functions the activation math calls with
// `simd("notinbranch")`, so GCC vectorises the CPU loops with glibc's libmvec
// variants (_ZGVdN8v_erff, ...), as glibc's own headers do under -ffast-math.
// Why not -ffast-math: it would drop NaN/signed-zero semantics the math relies
// on. Included only by the CPU loop translation units (built with
// -fno-math-errno), never by nvcc.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <math.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(MEMSLIM_HAVE_LIBMVEC)
#define MEMSLIM_SIMD_DECL __attribute__((simd("notinbranch")))
extern "C" {
float expf(float) MEMSLIM_SIMD_DECL;
float powf(float, float) MEMSLIM_SIMD_DECL;
float expm1f(float) MEMSLIM_SIMD_DECL;
float logf(float) MEMSLIM_SIMD_DECL;
float log1pf(float) MEMSLIM_SIMD_DECL;
#if !defined(__AVX512F__)
// Not in the AVX-512 build: libmvec's 16-lane erff rounds erf(-3.65) to -1
// (gelu(-5.17) = -0 where aten gives -6.2e-7); its gelu loop calls the 8-lane
// variant explicitly (cpu_loops_impl.h, gelu_forward_block).
float erff(float) MEMSLIM_SIMD_DECL;
#else
__m256 _ZGVdN8v_erff(__m256);
#endif
float erfcf(float) MEMSLIM_SIMD_DECL;
float tanhf(float) MEMSLIM_SIMD_DECL;
double exp(double) MEMSLIM_SIMD_DECL;
double expm1(double) MEMSLIM_SIMD_DECL;
double log(double) MEMSLIM_SIMD_DECL;
double log1p(double) MEMSLIM_SIMD_DECL;
double erf(double) MEMSLIM_SIMD_DECL;
double erfc(double) MEMSLIM_SIMD_DECL;
double tanh(double) MEMSLIM_SIMD_DECL;
}
#undef MEMSLIM_SIMD_DECL
#endif
