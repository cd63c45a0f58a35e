/*
 * widen-x32c1-avx512.c -- widens packed int4 panels (the packed int4
 * layout, nr = 32, kr = 1, include/qkern/woq.h) into the widened bf16
 * layout of the AMX B tiles, AVX-512 F/BW.
 *
 * Each pair of k-rows (k, k + 1; 32 bytes) becomes 64 bf16 values: the
 * (q[k], q[k+1]) pairs of columns 0..15, then of columns 16..31 (one
 * 64-byte row of each B tile, qk512_qb4w_widen_rows), so a chunk of 32 k
 * is 2 KiB, the layout the int8 kernels' widened panels have.  kc is a
 * multiple of 32 (whole groups), so no padding.  Exact: q <= 15.
 */
#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

void qk_woq_widen_x32c1__avx512(const int8_t* packed, size_t panels, size_t kc, void* out) {
  /* a panel's kc k-rows, then the next panel's, back to back both sides */
  qk512_qb4w_widen_rows((const uint8_t*)packed, panels * kc / 2, (char*)out);
}
