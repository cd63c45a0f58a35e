/*
 * f32-gemv-x1c0-avx512.c -- WoQ GEMV micro-kernel 4x1c0 on the *unpacked*
 * weight, AVX-512 F/BW + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: "panels" of one column holding all of K, i.e. w is the caller's
 * row-major (N, K) int8 matrix itself and needs no packing.  x in f32, f16
 * or bf16.  For each of up to 4 rows of x and 4 columns at a time, 16-wide
 * fp32 FMA partial sums along k (int8 widened in-register, x widened once
 * per step and shared by the 4 columns), a horizontal sum at the end, then
 * scale (multiply), bias (add) and one rounding to the output dtype.  The K
 * tail uses masked loads: nothing is read past a row of x or w.  The body
 * is specialised for each mr (1..4), so fewer rows cost fewer FMAs.
 */
#include <string.h>

#include "io-avx512.h"
#include "scalar-convert.h"
#include "ukernel-define.h"

/* 16 activations from k (mask selects the valid ones) as f32. */
QK_INLINE __m512 load_x(const char* row, size_t k, qk_dtype DT, __mmask16 mask) {
  if (DT == QK_F32) return _mm512_maskz_loadu_ps(mask, (const float*)row + k);
  const __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t*)row + k);
  if (DT == QK_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 int8 of a weight row from k (masked) as f32. */
QK_INLINE __m512 load_w(const int8_t* row, size_t k, __mmask16 mask) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row + k)));
}

/* R (= mr, a compile-time constant) rows: a memory-bound GEMV must not
 * spend FMAs on duplicated rows. */
QK_INLINE void gemv_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                         const void* const* a, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const char* ar[4];
  for (size_t i = 0; i < R; i++) ar[i] = (const char*)a[i];
  for (size_t n0 = 0; n0 < nc; n0 += 4) {
    const int8_t* wr[4];
    for (size_t j = 0; j < 4; j++) wr[j] = w + (n0 + j < nc ? n0 + j : nc - 1) * kc;
    __m512 acc[4][4];
    for (size_t i = 0; i < R; i++)
      for (size_t j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (size_t k = 0; k < kc; k += 16) {
      const __mmask16 mask = qk512_mask(kc - k);
      if ((k & 63) == 0) /* the same k of the next 4 rows, which follow these */
        for (size_t j = 0; j < 4; j++) _mm_prefetch((const char*)wr[j] + 4 * kc + k, _MM_HINT_T0);
      __m512 wv[4];
      for (size_t j = 0; j < 4; j++) wv[j] = load_w(wr[j], k, mask);
      for (size_t i = 0; i < R; i++) {
        const __m512 xv = load_x(ar[i], k, DT, mask);
        for (size_t j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
    for (size_t i = 0; i < R; i++) {
      char* crow = (char*)c + (ptrdiff_t)i * c_stride;
      for (size_t j = 0; j < 4 && n0 + j < nc; j++) {
        float v = _mm512_reduce_add_ps(acc[i][j]) * scale[n0 + j];
        if (bias) v = v + bias[n0 + j];
        qk_store_from_f32(crow, n0 + j, DT, v);
      }
    }
  }
}

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemv_ukernel_4x1c0__avx512, gemv_rows, 4)
