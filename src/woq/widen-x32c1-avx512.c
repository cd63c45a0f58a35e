/*
 * widen-x32c1-avx512.c -- widens packed int4 panels (the packed int4
 * layout, nr = 32, kr = 1, include/qkern/woq.h) into the widened bf16
 * layout of the AMX B tiles, AVX-512 F/BW.
 *
 * Each pair of k-rows (k, k + 1; 32 bytes) becomes 64 bf16 values: the
 * (q[k], q[k+1]) pairs of columns 0..15, then of columns 16..31 (one
 * 64-byte row of each B tile, qk512_qb4w_widen_pair), so a chunk of 32 k
 * is 2 KiB, the layout the int8 kernels' widened panels have.  kc is a
 * multiple of 32 (whole groups), so no padding.  Exact: q <= 15.
 */
#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

void qk_woq_widen_x32c1__avx512(const int8_t* packed, size_t panels, size_t kc, void* out) {
  const __m512i pairs = _mm512_load_si512(qk512_qb4w_pair_rows);
  const __m512i table = _mm512_load_si512(qk512_qb4w_bf16_of_q);
  const uint8_t* rows = (const uint8_t*)packed;
  char* dst = (char*)out;
  for (size_t p = 0; p < panels; p++)
    for (size_t k = 0; k < kc; k += 2, rows += 32, dst += 128) {
      if (k % 4 == 0) _mm_prefetch((const char*)rows + QK_PREFETCH_BYTES, _MM_HINT_T0);
      __m512i q0, q1;
      qk512_qb4w_widen_pair(rows, pairs, table, &q0, &q1);
      _mm512_storeu_si512(dst, q0);
      _mm512_storeu_si512(dst + 64, q1);
    }
}
