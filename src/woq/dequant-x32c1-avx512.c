/*
 * dequant-x32c1-avx512.c -- dequantizes packed int4 groupwise panels (nr =
 * 32, kr = 1, include/qkern/woq.h) into f32 panels of 32 columns, AVX-512
 * F/BW/VL + FMA + F16C.
 *
 * Contract: qk_woq_dequantize_fn.  Each int4 panel becomes one f32 panel,
 * each k's 32 values two 64-byte lines: columns 0..15 from the low
 * nibbles, then columns 16..31 from the high ones (qk512_qb4w_widen_f32;
 * kc, whole groups, is a
 * multiple of 32, so no k is padded): w = fma(q, s, z'), z' = fma(-8, s,
 * z), one rounding each (compute f32dq_qb4w, as the AVX2 dequantization).
 * Columns at or beyond nc take s = z = 0, so w = 0, and their scales are
 * not read.  The int4 comes from DRAM with no row step to hide the wait
 * behind: each line is prefetched into L1 and L2 ahead
 * (qk_prefetch_stream).
 */
#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

void qk_woq_dequant_x32c1__avx512(const uint8_t* packed, size_t panels, size_t kc,
                                  size_t group_size, const void* sz, size_t sz_stride, qk_dtype dt,
                                  size_t nc, float* out) {
  const size_t pair = 2 * qk_dtype_size(dt);
  const __m512 table = _mm512_load_ps(qk512_qb4w_f32_of_q);
  for (size_t p = 0; p < panels; p++, packed += kc * 16) {
    float* dst = out + p * kc * 32;
    for (size_t g = 0; g < kc / group_size; g++) {
      const char* row = (const char*)sz + g * sz_stride;
      __m512 s[2], zp[2]; /* columns 16h .. 16h + 15 of the panel */
      for (size_t h = 0; h < 2; h++) {
        const size_t col = 32 * p + 16 * h, left = col < nc ? nc - col : 0;
        qk512_qb4w_params16(row + col * pair, left < 16 ? left : 16, dt, &s[h], &zp[h]);
      }
      for (size_t k = g * group_size; k < (g + 1) * group_size; k++) {
        if ((k & 3) == 0) qk_prefetch_stream(packed + k * 16, 1);
        __m512 q0, q1;
        qk512_qb4w_widen_f32(0, packed + k * 16, table, &q0, &q1);
        _mm512_storeu_ps(dst + k * 32, _mm512_fmadd_ps(q0, s[0], zp[0]));
        _mm512_storeu_ps(dst + k * 32 + 16, _mm512_fmadd_ps(q1, s[1], zp[1]));
      }
    }
  }
}
