/*
 * split-x-avx512.c -- splits a row of f32 or f16 activations into bf16
 * planes whose sum is the row exactly, for the bf16 (AMX) kernels.
 * AVX-512 F/BW + F16C.
 *
 * f32 (24 significant bits) -> 3 planes, f16 (11 bits) -> 2: plane 0 is x
 * truncated to its top 16 bits (bf16), plane 1 the top 16 bits of the exact
 * remainder x - plane0, plane 2 the rest.  Each remainder is exact in f32
 * and the last fits bf16, so x == sum of the planes for finite x (a
 * remainder below 2^-126 is lost by the kernels' DAZ, within the bound of
 * docs/semantics.rst).  Infinities and NaNs stay whole in plane 0 (NaN kept
 * quiet), later planes 0.  Each plane holds roundup(kc, 32) values, zero
 * past kc; x is not read past kc.
 */
#include "io-avx512.h"

/* One plane: the top 16 bits of 32 lanes (two vectors) as 32 bf16. */
QK_INLINE __m512i high_halves(__m512i lo16, __m512i hi16, __m512i idx) {
  return _mm512_permutex2var_epi16(lo16, idx, hi16);
}

/* 16 lanes: plane bits (x with its low 16 bits cleared, NaN kept quiet) and
 * the exact remainder (0 for non-finite x). */
QK_INLINE __m512i take_plane(__m512* x) {
  const __m512i bits = _mm512_castps_si512(*x);
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __mmask16 nonfinite = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exp_mask), exp_mask);
  const __mmask16 nan = nonfinite & _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff));
  __m512i top = _mm512_and_si512(bits, _mm512_set1_epi32((int)0xffff0000u));
  top = _mm512_mask_or_epi32(top, nan, top, _mm512_set1_epi32(0x00400000));
  *x = _mm512_maskz_sub_ps((__mmask16)~nonfinite, *x, _mm512_castsi512_ps(top));
  return top;
}

void qk_woq_split_x__avx512(const void* row, qk_dtype dt, size_t kc, void* out) {
  const size_t planes = dt == QK_F32 ? 3 : 2;
  const size_t stride = (kc + 31) / 32 * 32;
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  uint16_t* o = (uint16_t*)out;
  for (size_t k = 0; k < stride; k += 32) {
    const size_t left = k < kc ? kc - k : 0;
    const __mmask16 m0 = qk512_mask(left), m1 = qk512_mask(left > 16 ? left - 16 : 0);
    __m512 x0, x1;
    if (dt == QK_F32) {
      x0 = _mm512_maskz_loadu_ps(m0, (const float*)row + k);
      x1 = _mm512_maskz_loadu_ps(m1, (const float*)row + k + 16);
    } else {
      x0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, (const uint16_t*)row + k));
      x1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, (const uint16_t*)row + k + 16));
    }
    for (size_t p = 0; p < planes; p++) {
      const __m512i t0 = take_plane(&x0), t1 = take_plane(&x1);
      _mm512_storeu_si512(o + p * stride + k, high_halves(t0, t1, idx));
    }
  }
}
