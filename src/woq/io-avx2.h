/*
 * io-avx2.h -- AVX2 (FMA, F16C) helpers shared by the AVX2 WoQ kernels:
 * row stores in the output dtype.  Include only from files compiled with
 * the AVX2 flags.
 */
#ifndef QKERN_IO_AVX2_H
#define QKERN_IO_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ukernel-define.h"

/* 8 int8 at p -> 8 f32 (exact). */
QK_INLINE __m256 qk256_i8_to_f32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

/* f32 -> bf16 bits (round to nearest even, NaN kept quiet) in 8 x u16. */
QK_INLINE __m128i qk256_f32_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* Stores the first `count` (<= 8) lanes of v at element n of a dtype-DT row. */
QK_INLINE void qk256_store_row(char* row, size_t n, qk_dtype DT, __m256 v, size_t count) {
  if (DT == QK_F32) {
    if (count >= 8) {
      _mm256_storeu_ps((float*)row + n, v);
    } else {
      float tmp[8];
      _mm256_storeu_ps(tmp, v);
      memcpy(row + 4 * n, tmp, 4 * count);
    }
    return;
  }
  const __m128i h = DT == QK_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                 : qk256_f32_to_bf16(v);
  if (count >= 8) {
    _mm_storeu_si128((__m128i*)(row + 2 * n), h);
  } else {
    uint16_t tmp[8];
    _mm_storeu_si128((__m128i*)tmp, h);
    memcpy(row + 2 * n, tmp, 2 * count);
  }
}

#endif /* QKERN_IO_AVX2_H */
