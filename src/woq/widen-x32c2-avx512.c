/*
 * widen-x32c2-avx512.c -- widens packed int8 panels of layout nr = 32, kr = 2
 * into the widened bf16 layout (include/qkern/woq.h), AVX-512 F/BW.
 *
 * Each k-group's 64 bytes become 64 bf16 in the same order (columns 0..15
 * then 16..31, each as (k, k+1)), i.e. one 64-byte row of each of the two
 * AMX B tiles of the panel; each panel's k-groups are zero-padded to a
 * multiple of 16.  Exact: |w| <= 128 needs at most 8 significant bits.
 */
#include "io-avx512.h"

void qk_woq_widen_x32c2__avx512(const int8_t* packed, size_t panels, size_t kc, void* out) {
  const size_t groups = (kc + 1) / 2, padded = (groups + 15) / 16 * 16;
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  char* dst = (char*)out;
  for (size_t p = 0; p < panels; p++) {
    for (size_t g = 0; g < groups; g++, packed += 64, dst += 128) {
      _mm_prefetch((const char*)packed + QK_PREFETCH_BYTES, _MM_HINT_T0);
      _mm512_storeu_si512(dst, qk512_i8_to_bf16(packed, idx));
      _mm512_storeu_si512(dst + 64, qk512_i8_to_bf16(packed + 32, idx));
    }
    for (size_t g = groups; g < padded; g++, dst += 128) {
      _mm512_storeu_si512(dst, _mm512_setzero_si512());
      _mm512_storeu_si512(dst + 64, _mm512_setzero_si512());
    }
  }
}
