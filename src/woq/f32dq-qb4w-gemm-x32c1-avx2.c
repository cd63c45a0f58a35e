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

/* R rows (a compile-time constant, QK_DEFINE_INT4_UKERNEL): the f32w body
 * without a scale. */
QK_INLINE void f32dq_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                          size_t group_size, const float* const* a, const uint8_t* w,
                          const void* sz, size_t sz_stride, const float* bias, void* c,
                          ptrdiff_t c_stride) {
  (void)group_size, (void)sz, (void)sz_stride;
  x16c1(R, 4, DT, nc, kc, (const void* const*)a, (const int8_t*)w, NULL, bias, c, c_stride);
}

QK_DEFINE_INT4_UKERNEL(qk_woq_f32dq_qb4w_gemm_ukernel_6x32c1__avx2, f32dq_rows, 6)
