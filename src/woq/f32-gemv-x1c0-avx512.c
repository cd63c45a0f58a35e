/*
 * f32-gemv-x1c0-avx512.c -- WoQ GEMV micro-kernel 8x1c0 on the *unpacked*
 * weight, AVX-512 F/BW + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: "panels" of one column holding all of K, i.e. w is the caller's
 * row-major (N, K) int8 matrix itself and needs no packing.  x in f32 (the
 * driver converts f16 and bf16 rows once per row block: convert_x).  For
 * each of up to 8 rows of x and 4 columns at a time (3 above 4 rows: 24
 * sums in zmm registers), 16-wide fp32 FMA partial sums along k (int8
 * widened in-register once per step and shared by every row), a
 * horizontal sum at the end, then scale (multiply), bias (add) and one
 * rounding to the output dtype.  The K tail uses masked loads: nothing is
 * read past a row of x or w.  Each of the C rows of w is prefetched into L2
 * QK_GEMV_L2_PREFETCH_BYTES ahead (C streams a row apart, more than the
 * hardware prefetcher follows) and into L1 at the next C rows.  The body
 * is specialised for each mr (1..8), so fewer rows cost fewer FMAs; the
 * columns per step change no sum, so every mr gives a row the same bits.
 */
#include <string.h>

#include "io-avx512.h"
#include "scalar-convert.h"
#include "ukernel-define.h"

/* 16 int8 of a weight row from k as f32: all 16, or (MASKED) those that
 * mask selects. */
QK_INLINE __m512 load_w(const int MASKED, const int8_t* row, size_t k, __mmask16 mask) {
  const __m128i q =
      MASKED ? _mm_maskz_loadu_epi8(mask, row + k) : _mm_loadu_si128((const __m128i*)(row + k));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

/* One step of 16 k for R rows and C columns: acc[i][j] += x_i[k..] *
 * w_j[k..]; MASKED: only the k that mask selects (the K tail; plain loads
 * elsewhere, which cost no ALU uop). */
QK_INLINE void gemv_step(const size_t R, const size_t C, const int MASKED, __m512 acc[8][4],
                         const float* const* ar, const int8_t* const* wr, size_t k,
                         __mmask16 mask) {
  __m512 wv[4];
#pragma GCC unroll 4
  for (size_t j = 0; j < C; j++) wv[j] = load_w(MASKED, wr[j], k, mask);
#pragma GCC unroll 8
  for (size_t i = 0; i < R; i++) {
    __m512 xv = MASKED ? _mm512_maskz_loadu_ps(mask, ar[i] + k) : _mm512_loadu_ps(ar[i] + k);
    QK512_IN_REGISTER(xv);
#pragma GCC unroll 4
    for (size_t j = 0; j < C; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

/* R (= mr, a compile-time constant) rows: a memory-bound GEMV must not
 * spend FMAs on duplicated rows. */
QK_INLINE void gemv_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                         const void* const* a, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const size_t C = R > 4 ? 3 : 4; /* columns per step */
  const float* ar[8];
  for (size_t i = 0; i < R; i++) ar[i] = (const float*)a[i];
  for (size_t n0 = 0; n0 < nc; n0 += C) {
    const int8_t* wr[4];
    for (size_t j = 0; j < C; j++) wr[j] = w + (n0 + j < nc ? n0 + j : nc - 1) * kc;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (size_t i = 0; i < R; i++)
#pragma GCC unroll 4
      for (size_t j = 0; j < C; j++) acc[i][j] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= kc; k += 16) {
      if ((k & 63) == 0) /* the same k of the next C rows, which follow these */
#pragma GCC unroll 4
        for (size_t j = 0; j < C; j++) {
          _mm_prefetch((const char*)wr[j] + C * kc + k, _MM_HINT_T0);
          _mm_prefetch((const char*)wr[j] + k + QK_GEMV_L2_PREFETCH_BYTES, _MM_HINT_T1);
        }
      gemv_step(R, C, 0, acc, ar, wr, k, 0);
    }
    if (k < kc) gemv_step(R, C, 1, acc, ar, wr, k, qk512_mask(kc - k));
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

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemv_ukernel_8x1c0__avx512, gemv_rows, 8)
