/*
 * widen-x16c1-avx2.c -- widens packed int8 panels of layout nr = 16, kr = 1
 * into the widened f32 layout (include/qkern/woq.h), AVX2.
 *
 * Each k's 16 bytes become 16 f32 in the same order (64 bytes, one cache
 * line); each panel's k values are zero-padded to a multiple of 16.
 * Exact: every int8 is an f32.  Each line of the packed panels is
 * prefetched into L1 and L2 ahead (qk_prefetch_stream): the widening reads
 * them from DRAM with no arithmetic to hide the wait behind.
 */
#include <immintrin.h>

#include "ukernel-define.h"

void qk_woq_widen_x16c1__avx2(const int8_t* packed, size_t panels, size_t kc, void* out) {
  const size_t padded = (kc + 15) / 16 * 16;
  float* dst = (float*)out;
  for (size_t p = 0; p < panels; p++) {
    for (size_t k = 0; k < kc; k++, packed += 16, dst += 16) {
      if ((k & 3) == 0) qk_prefetch_stream(packed, 1);
      const __m128i v = _mm_loadu_si128((const __m128i*)packed);
      _mm256_storeu_ps(dst, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
      _mm256_storeu_ps(dst + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
    }
    for (size_t k = kc; k < padded; k++, dst += 16) {
      _mm256_storeu_ps(dst, _mm256_setzero_ps());
      _mm256_storeu_ps(dst + 8, _mm256_setzero_ps());
    }
  }
}
