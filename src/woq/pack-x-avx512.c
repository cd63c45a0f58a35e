/*
 * pack-x-avx512.c -- packs one row of activations into the AMX A-tile
 * layout of the bf16 (AMX) kernels (include/qkern/woq.h, "Packed x").
 * AVX-512 F/BW + F16C.
 *
 * bf16 x is copied as is (1 plane).  f32 (24 significant bits) -> 3 bf16
 * planes, f16 (11 bits) -> 2: plane 0 is x truncated to its top 16 bits
 * (bf16), plane 1 the top 16 bits of the exact remainder x - plane0, plane 2
 * the rest.  Each remainder is exact in f32 and the last fits bf16, so x ==
 * sum of the planes for finite x (a remainder below 2^-126 is lost by the
 * kernels' DAZ, within the bound of docs/semantics.rst).  Infinities and
 * NaNs stay whole in plane 0 (NaN kept quiet), later planes 0.
 *
 * Writes, for each chunk c of 32 k and each plane p, the row's 32 values
 * (zero past kc) at out + c * chunk_stride + p * 2048 bytes; x is not read
 * past kc.
 */
#include "io-avx512.h"

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

void qk_woq_pack_x__avx512(const void* row, qk_dtype dt, size_t kc, void* out,
                           size_t chunk_stride) {
  const size_t planes = dt == QK_F32 ? 3 : dt == QK_F16 ? 2 : 1;
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  char* o = (char*)out;
  for (size_t k = 0; k < kc; k += 32, o += chunk_stride) {
    const size_t left = kc - k;
    QK_ASAN_CHECK((const char*)row + k * (dt == QK_F32 ? 4 : 2),
                  (left < 32 ? left : 32) * (dt == QK_F32 ? 4 : 2), 0);
    if (dt == QK_BF16) {
      const __mmask32 m = left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1u);
      _mm512_storeu_si512(o, _mm512_maskz_loadu_epi16(m, (const uint16_t*)row + k));
      continue;
    }
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
      _mm512_storeu_si512(o + p * 2048, _mm512_permutex2var_epi16(t0, idx, t1));
    }
  }
}
