/*
 * f32-gemm-x16c1-avx2.c -- WoQ GEMM micro-kernels 1x16c1, 4x16c1 and
 * 6x16c1 on packed int8 panels, and f32w 6x16c1 on widened f32 panels,
 * AVX2 + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 16,
 * kr = 1, with qk_woq_convert_x_fn.  The body, its order of sums and its
 * epilogue (scale, bias, one rounding) are x16c1 (gemm-x16c1-avx2.h): every
 * kernel here sums each column in the same order, so all of them give a
 * row the same bits.
 */
#include "gemm-x16c1-avx2.h"
#include "qkern/woq_ukernels.h"

#define f32_gemm_x16c1(R, DT, ...) x16c1(R, 1, DT, __VA_ARGS__)
#define f32w_gemm_x16c1(R, DT, ...) x16c1(R, 4, DT, __VA_ARGS__)

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_1x16c1__avx2, f32_gemm_x16c1, 1)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_4x16c1__avx2, f32_gemm_x16c1, 4)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_6x16c1__avx2, f32_gemm_x16c1, 6)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32w_gemm_ukernel_6x16c1__avx2, f32w_gemm_x16c1, 6)
