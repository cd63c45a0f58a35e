/*
 * qb4w-avx2.h -- AVX2 (FMA, F16C) helpers shared by the kernels on int4
 * groupwise weights (include/qkern/woq.h): the scales and zeros of a group
 * in f32.  Include only from files compiled with the AVX2 flags.
 */
#ifndef QKERN_QB4W_AVX2_H
#define QKERN_QB4W_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "ukernel-define.h"

/* The scales s and z' = fma(-8, s, z) of 8 columns, from their 8 (s, z)
 * pairs at p, of dtype DT. */
QK_INLINE void qk256_qb4w_load_params8(const char* p, qk_dtype DT, __m256* s, __m256* zp) {
  __m256 a, b; /* a = s0 z0 s1 z1 | s2 z2 s3 z3, b: pairs 4..7 */
  if (DT == QK_F32) {
    a = _mm256_loadu_ps((const float*)p);
    b = _mm256_loadu_ps((const float*)p + 8);
  } else {
    const __m128i h0 = _mm_loadu_si128((const __m128i*)p);
    const __m128i h1 = _mm_loadu_si128((const __m128i*)(p + 16));
    if (DT == QK_F16) {
      a = _mm256_cvtph_ps(h0);
      b = _mm256_cvtph_ps(h1);
    } else {
      a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
      b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
    }
  }
  /* s0 s1 s4 s5 | s2 s3 s6 s7, then the 64-bit quarters in order 0 2 1 3 */
  const __m256 s_mixed = _mm256_shuffle_ps(a, b, 0x88), z_mixed = _mm256_shuffle_ps(a, b, 0xdd);
  *s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s_mixed), 0xd8));
  const __m256 z = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(z_mixed), 0xd8));
  *zp = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), *s, z);
}

/* qk256_qb4w_load_params8 for columns col..col+7 of a row of pairs, reading none at
 * or beyond column nc (those get zeros). */
QK_INLINE void qk256_qb4w_load_params(const char* row, size_t col, size_t nc, qk_dtype DT,
                                      __m256* s, __m256* zp) {
  const size_t pair = 2 * qk_dtype_size(DT);
  if (col + 8 <= nc) {
    qk256_qb4w_load_params8(row + col * pair, DT, s, zp);
    return;
  }
  char tmp[8 * 8] __attribute__((aligned(32))) = {0};
  if (col < nc) memcpy(tmp, row + col * pair, (nc - col) * pair);
  qk256_qb4w_load_params8(tmp, DT, s, zp);
}

#endif /* QKERN_QB4W_AVX2_H */
