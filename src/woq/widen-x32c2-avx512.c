/*
 * widen-x32c2-avx512.c -- widens packed int8 panels of layout nr = 32, kr = 2
 * into the widened layouts (include/qkern/woq.h), AVX-512 F/BW: bf16 (the
 * AMX kernels and bf16w_gemm_8x32c2__avx512bf16) and f32
 * (f32w_gemm_6x32c2__avx512).
 *
 * Each k-group's 64 bytes become 64 values in the same order (in bf16,
 * columns 0..15 then 16..31, each as (k, k+1), are one 64-byte row of each
 * of the two AMX B tiles of the panel); each panel's k-groups are
 * zero-padded to a multiple of 16.  Exact: |w| <= 128 needs at most 8
 * significant bits.  The driver widens a chunk with no row step to hide
 * its reads behind, so each line is prefetched into L1 and L2 ahead
 * (qk_prefetch_stream): on a Zen 4, one thread, cold weights, the layer at
 * M = 64 in bfloat16 took 0.94-0.95 of the time it took with the L1
 * prefetch alone.
 */
#include "io-avx512.h"

/* The panels widened to values of WB bytes (2: bf16, 4: f32). */
QK_INLINE void widen_x32c2(const size_t WB, const int8_t* packed, size_t panels, size_t kc,
                           void* out) {
  const size_t groups = (kc + 1) / 2, padded = (groups + 15) / 16 * 16;
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  char* dst = (char*)out;
  for (size_t p = 0; p < panels; p++) {
    for (size_t g = 0; g < groups; g++, packed += 64, dst += 64 * WB)
      qk512_widen_group(WB, packed, idx, dst, 1);
    qk512_zero_lines(dst, (padded - groups) * WB);
    dst += 64 * (padded - groups) * WB;
  }
}

void qk_woq_widen_x32c2__avx512(const int8_t* packed, size_t panels, size_t kc, void* out) {
  widen_x32c2(2, packed, panels, kc, out);
}

void qk_woq_widen_f32_x32c2__avx512(const int8_t* packed, size_t panels, size_t kc, void* out) {
  widen_x32c2(4, packed, panels, kc, out);
}
