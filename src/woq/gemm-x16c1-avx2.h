/*
 * gemm-x16c1-avx2.h -- the body of the AVX2 micro-kernels on panels of 16
 * columns, one k per 16-value row (kr = 1), AVX2 + FMA + F16C; include only
 * from files compiled with the AVX2 flags.
 *
 * x16c1(R, WB, DT, ...) computes R rows (a compile-time constant: the
 * kernels specialise it for each mr, QK_DEFINE_UKERNEL_ROWS) and nc
 * columns, x read in f32 whatever DT (the driver converts f16 / bf16 rows
 * once; DT is then the output's dtype), so each broadcast of x is one
 * load.  Weights of WB bytes: packed int8 (WB = 1; the 16 of one k widened
 * in-register to two vectors of 8 f32) or f32 panels (WB = 4, loaded as
 * they are, k padded to a multiple of 16: the widened f32 layout,
 * include/qkern/woq.h), shared by the R rows; fp32 FMA sums, one per row
 * and 8 columns, accumulated in increasing k.  Fewer than eight sums would
 * wait on the FMA latency, so one row runs four panels at once and two
 * rows two (eight sums; the same order per column).  Three rows stay at
 * one panel: two would need 15 of the 16 ymm registers, and GCC then keeps
 * sums on the stack (1.5x slower on a Zen 3).  Epilogue: scale (multiply;
 * none when scale is NULL), bias (add), one rounding to the output dtype.
 * Every kernel built on it sums each column in the same order.
 */
#ifndef QKERN_GEMM_X16C1_AVX2_H
#define QKERN_GEMM_X16C1_AVX2_H

#include <immintrin.h>

#include "io-avx2.h"

/* Bytes of one panel of kc k values: packed int8 (WB = 1), or widened f32
 * (WB = 4, k padded to a multiple of 16). */
QK_INLINE size_t x16c1_panel_bytes(size_t WB, size_t kc) {
  return WB == 1 ? kc * 16 : (kc + 15) / 16 * 16 * 64;
}

/* P consecutive panels from column n0 (P * 16 <= nc - n0 + 15) for MR rows
 * (P * MR <= 6), weights of WB bytes: one sum per row and 8 columns, each
 * in increasing k. */
QK_INLINE void x16c1_panels(const size_t MR, const size_t P, const size_t WB, const qk_dtype DT,
                            size_t n0, size_t nc, size_t kc, const float* const* ar,
                            char* const* cr, const int8_t* w, const float* scale,
                            const float* bias) {
  __m256 acc[6][2];
  for (size_t i = 0; i < P * MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (size_t k = 0; k < kc; k++) {
    for (size_t p = 0; p < P; p++) {
      const int8_t* wp = w + p * x16c1_panel_bytes(WB, kc) + k * 16 * WB;
      if (WB == 4 || (k & 3) == 0) _mm_prefetch((const char*)wp + QK_PREFETCH_BYTES, _MM_HINT_T0);
      const __m256 w0 = WB == 1 ? qk256_i8_to_f32(wp) : _mm256_loadu_ps((const float*)wp);
      const __m256 w1 = WB == 1 ? qk256_i8_to_f32(wp + 8) : _mm256_loadu_ps((const float*)wp + 8);
      for (size_t i = 0; i < MR; i++) {
        const __m256 xv = _mm256_broadcast_ss(ar[i] + k);
        acc[p * MR + i][0] = _mm256_fmadd_ps(xv, w0, acc[p * MR + i][0]);
        acc[p * MR + i][1] = _mm256_fmadd_ps(xv, w1, acc[p * MR + i][1]);
      }
    }
  }
  /* scale (NULL: none, y = sum + bias) and bias hold whole panels.  Unrolled so that the sums are
   * indexed by constants only and stay in registers through the k loop
   * (GCC otherwise stores them to the stack on every k for bf16 y). */
#pragma GCC unroll 4
  for (size_t p = 0; p < P; p++) {
    const size_t col = n0 + 16 * p, count = nc - col;
    const __m256 s0 = scale ? _mm256_loadu_ps(scale + col) : _mm256_setzero_ps();
    const __m256 s1 = scale ? _mm256_loadu_ps(scale + col + 8) : _mm256_setzero_ps();
    const __m256 b0 = bias ? _mm256_loadu_ps(bias + col) : _mm256_setzero_ps();
    const __m256 b1 = bias ? _mm256_loadu_ps(bias + col + 8) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (size_t i = 0; i < MR; i++) {
      __m256 v0 = acc[p * MR + i][0], v1 = acc[p * MR + i][1];
      if (scale) {
        v0 = _mm256_mul_ps(v0, s0);
        v1 = _mm256_mul_ps(v1, s1);
      }
      if (bias) {
        v0 = _mm256_add_ps(v0, b0);
        v1 = _mm256_add_ps(v1, b1);
      }
      qk256_store_row(cr[i], col, DT, v0, count);
      if (count > 8) qk256_store_row(cr[i], col + 8, DT, v1, count - 8);
    }
  }
}

QK_INLINE void x16c1(const size_t R, const size_t WB, const qk_dtype DT, size_t nc, size_t kc,
                     const void* const* a, const int8_t* w, const float* scale, const float* bias,
                     void* c, ptrdiff_t c_stride) {
  const float* ar[6];
  char* cr[6];
  qk_row_pointers(R, a, c, c_stride, ar, cr);
  /* panels at a time (see the top) */
  const size_t P = R == 1 ? 4 : R == 2 ? 2 : 1;
  size_t n0 = 0;
  if (P > 1)
    for (; n0 + 16 * (P - 1) < nc; n0 += 16 * P, w += P * x16c1_panel_bytes(WB, kc))
      x16c1_panels(R, P, WB, DT, n0, nc, kc, ar, cr, w, scale, bias);
  for (; n0 < nc; n0 += 16, w += x16c1_panel_bytes(WB, kc))
    x16c1_panels(R, 1, WB, DT, n0, nc, kc, ar, cr, w, scale, bias);
}

#endif /* QKERN_GEMM_X16C1_AVX2_H */
