/*
 * gemv-rows-avx512.h -- the loops over columns and k, the prefetches and
 * the epilogue shared by the AVX-512 GEMVs on the unpacked weight (layout
 * nr = 1, kr = 0).  Include it after defining GEMV_K_STEP (k per step),
 * the element type gemv_x of the rows of x the kernel reads, and
 *
 *   QK_INLINE void gemv_step(const size_t R, const size_t C, const int MASKED,
 *                            __m512 acc[8][4], const gemv_x* const* ar,
 *                            const int8_t* const* wr, size_t k, size_t left);
 *
 * which adds GEMV_K_STEP k from k of R rows of x and C weight rows into
 * acc[i][j] (MASKED: only the first `left` of them, the K tail, nothing
 * read beyond).  C columns at a time (4, or 3 above 4 rows: at most 24
 * sums in zmm registers), each of their rows prefetched into L2
 * QK_GEMV_L2_PREFETCH_BYTES ahead (C streams a row apart, more than the
 * hardware prefetcher follows) and into L1 at the next C rows; then a
 * horizontal sum per output, scale (multiply), bias (add) and one
 * rounding to DT.  The columns per step change no sum, so every mr gives
 * a row the same bits.
 */
#ifndef QKERN_GEMV_ROWS_AVX512_H
#define QKERN_GEMV_ROWS_AVX512_H

#include "scalar-convert.h"

/* R (= mr, a compile-time constant) rows: a memory-bound GEMV must not
 * spend multiply-adds on duplicated rows. */
QK_INLINE void gemv_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                         const void* const* a, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const size_t C = R > 4 ? 3 : 4; /* columns per step */
  const gemv_x* ar[8];
  for (size_t i = 0; i < R; i++) ar[i] = (const gemv_x*)a[i];
  for (size_t n0 = 0; n0 < nc; n0 += C) {
    const int8_t* wr[4];
    for (size_t j = 0; j < C; j++) wr[j] = w + (n0 + j < nc ? n0 + j : nc - 1) * kc;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (size_t i = 0; i < R; i++)
#pragma GCC unroll 4
      for (size_t j = 0; j < C; j++) acc[i][j] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + GEMV_K_STEP <= kc; k += GEMV_K_STEP) {
      if ((k & 63) == 0) /* the same k of the next C rows, which follow these */
#pragma GCC unroll 4
        for (size_t j = 0; j < C; j++) {
          _mm_prefetch((const char*)wr[j] + C * kc + k, _MM_HINT_T0);
          _mm_prefetch((const char*)wr[j] + k + QK_GEMV_L2_PREFETCH_BYTES, _MM_HINT_T1);
        }
      gemv_step(R, C, 0, acc, ar, wr, k, GEMV_K_STEP);
    }
    if (k < kc) gemv_step(R, C, 1, acc, ar, wr, k, kc - k);
#pragma GCC unroll 8
    for (size_t i = 0; i < R; i++) {
      char* crow = (char*)c + (ptrdiff_t)i * c_stride;
#pragma GCC unroll 4
      for (size_t j = 0; j < C; j++) {
        if (n0 + j >= nc) break;
        float v = _mm512_reduce_add_ps(acc[i][j]) * scale[n0 + j];
        if (bias) v = v + bias[n0 + j];
        qk_store_from_f32(crow, n0 + j, DT, v);
      }
    }
  }
}

#endif /* QKERN_GEMV_ROWS_AVX512_H */
