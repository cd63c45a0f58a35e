/*
 * io-avx512.h -- AVX-512 (F/BW/VL, F16C) helpers shared by the AVX-512 WoQ
 * kernels: int8 weight widening and row stores in the output dtype.
 * Include only from files compiled with the AVX-512 flags.
 */
#ifndef QKERN_IO_AVX512_H
#define QKERN_IO_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "sanitize.h"
#include "ukernel-define.h"

/* 16 int8 at p -> 16 f32 (exact). */
QK_INLINE __m512 qk512_i8_to_f32(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

/* Lanes of mask for the first `count` of 16 columns. */
QK_INLINE __mmask16 qk512_mask(size_t count) {
  return count >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1u);
}

/* f32 -> bf16 bits (round to nearest even, NaN kept quiet), in 16-bit lanes. */
QK_INLINE __m256i qk512_f32_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* Lanes 0 .. the highest lane selected by mask. */
QK_INLINE size_t qk512_mask_span(__mmask16 mask) {
  return mask ? 32 - (size_t)__builtin_clz((unsigned)mask) : 0;
}

/* Stores the lanes of v selected by mask at element n of a dtype-DT row. */
QK_INLINE void qk512_store(char* row, size_t n, qk_dtype DT, __m512 v, __mmask16 mask) {
  const size_t esize = DT == QK_F32 ? 4 : 2;
  QK_ASAN_CHECK(row + esize * n, esize * qk512_mask_span(mask), 1);
  switch (DT) {
    case QK_F32:
      _mm512_mask_storeu_ps(row + 4 * n, mask, v);
      break;
    case QK_F16:
      _mm256_mask_storeu_epi16(row + 2 * n, mask,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case QK_BF16:
      _mm256_mask_storeu_epi16(row + 2 * n, mask, qk512_f32_to_bf16(v));
      break;
  }
}

#endif /* QKERN_IO_AVX512_H */
