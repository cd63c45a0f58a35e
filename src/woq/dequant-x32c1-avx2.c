/*
 * dequant-x32c1-avx2.c -- dequantizes packed int4 groupwise panels (nr =
 * 32, kr = 1, include/qkern/woq.h) into f32 panels of 16 columns, AVX2 +
 * FMA + F16C.
 *
 * Contract: qk_woq_dequantize_fn.  Each int4 panel becomes two f32 panels
 * in the widened f32 layout of nr = 16 (columns 0..15 from the low
 * nibbles, then columns 16..31 from the high ones; each k's 16 values one
 * 64-byte line; kc, whole groups, is a multiple of 32, so no k is
 * padded): w = fma(q, s, z'), z' = fma(-8, s, z), one rounding each
 * (compute f32dq_qb4w).  Columns at or beyond nc take s = z = 0, so w = 0,
 * and their scales are not read; a second f32 panel wholly beyond nc is
 * not written (no kernel reads it).  The int4 comes from DRAM with no row
 * step to hide the wait behind: each line is prefetched into L1 and L2
 * ahead (qk_prefetch_stream).
 */
#include <immintrin.h>

#include "qb4w-avx2.h"
#include "qkern/woq_ukernels.h"

QK_INLINE void store_dequantized(float* dst, __m256i q, __m256 s, __m256 zp) {
  _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, zp));
}

void qk_woq_dequant_x32c1__avx2(const uint8_t* packed, size_t panels, size_t kc, size_t group_size,
                                const void* sz, size_t sz_stride, qk_dtype dt, size_t nc,
                                float* out) {
  const __m256i low = _mm256_set1_epi32(15);
  for (size_t p = 0; p < panels; p++, packed += kc * 16) {
    float* lo = out + p * 2 * kc * 16; /* columns 32p .. 32p + 15 */
    float* hi = lo + kc * 16;          /* columns 32p + 16 .. 32p + 31 */
    const int high = 32 * p + 16 < nc;
    for (size_t g = 0; g < kc / group_size; g++) {
      const char* row = (const char*)sz + g * sz_stride;
      __m256 s[4], zp[4]; /* columns 8v .. 8v + 7 of the panel */
      for (size_t v = 0; v < (high ? 4u : 2u); v++)
        qk256_qb4w_load_params(row, 32 * p + 8 * v, nc, dt, &s[v], &zp[v]);
      for (size_t k = g * group_size; k < (g + 1) * group_size; k++) {
        if ((k & 3) == 0) qk_prefetch_stream(packed + k * 16, 1);
        const uint8_t* b = packed + k * 16;
        const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)b));
        const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(b + 8)));
        store_dequantized(lo + k * 16, _mm256_and_si256(b0, low), s[0], zp[0]);
        store_dequantized(lo + k * 16 + 8, _mm256_and_si256(b1, low), s[1], zp[1]);
        if (high) {
          store_dequantized(hi + k * 16, _mm256_srli_epi32(b0, 4), s[2], zp[2]);
          store_dequantized(hi + k * 16 + 8, _mm256_srli_epi32(b1, 4), s[3], zp[3]);
        }
      }
    }
  }
}
