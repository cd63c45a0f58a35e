/*
 * f32dq-qb4w-gemm-x32c1-avx2.c -- the WoQ GEMM micro-kernel 6x32c1 on int4
 * groupwise weights the driver dequantized to f32, AVX2 + FMA + F16C.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), compute
 * f32dq_qb4w: w holds the f32 panels of qk_woq_dequantize_fn (two of 16
 * columns per int4 panel, the groups' scales and zeros in them already),
 * so the kernel is the int8 f32w body (x16c1, gemm-x16c1-avx2.h) without a
 * scale: one FMA chain per output over all of kc, then + bias.  x rows are
 * read in f32, kc values each (no group sums).
 */
#include "gemm-x16c1-avx2.h"
#include "qkern/woq_ukernels.h"

/* R rows (1..6, the switch below): the f32w body without a scale. */
#define f32dq_rows(R, DT, nc, kc, rows, panels, bias, c, c_stride) \
  x16c1(R, 4, DT, nc, kc, rows, panels, NULL, bias, c, c_stride)

void qk_woq_f32dq_qb4w_gemm_ukernel_6x32c1__avx2(size_t mr, size_t nc, size_t kc, size_t group_size,
                                                 const float* const* a, qk_dtype dt,
                                                 const uint8_t* w, const void* sz, size_t sz_stride,
                                                 const float* bias, void* c, ptrdiff_t c_stride) {
  (void)group_size, (void)sz, (void)sz_stride;
  const void* const* rows = (const void* const*)a;
  const int8_t* panels = (const int8_t*)w;
  switch (dt) {
    case QK_F32:
      QK_ROWS_SWITCH(f32dq_rows, 6, QK_F32, nc, kc, rows, panels, bias, c, c_stride) break;
    case QK_F16:
      QK_ROWS_SWITCH(f32dq_rows, 6, QK_F16, nc, kc, rows, panels, bias, c, c_stride) break;
    case QK_BF16:
      QK_ROWS_SWITCH(f32dq_rows, 6, QK_BF16, nc, kc, rows, panels, bias, c, c_stride) break;
  }
}
