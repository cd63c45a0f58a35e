/*
 * f32dq-qb4w-gemm-x32c1-avx512.c -- the WoQ GEMM micro-kernel 8x32c1 on
 * int4 groupwise weights the driver dequantized to f32, AVX-512 F/BW/VL +
 * FMA + F16C.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), compute
 * f32dq_qb4w, as f32dq_qb4w_gemm_6x32c1__avx2: w holds the f32 panels of
 * qk_woq_dequant_x32c1__avx512 (one of 32 columns per int4 panel, a k's
 * 32 values two 64-byte lines, the groups' scales and zeros in them
 * already), so each output is one FMA chain over all of kc in increasing
 * k, then + bias, one rounding: the bits of the AVX2 kernel.  x rows are
 * read in f32, kc values each (no group sums).  8 rows hold 16 of the 32
 * zmm registers in sums; the body is specialised for each mr.
 */
#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

/* R rows (a compile-time constant) over all nc columns, panel by panel. */
QK_INLINE void f32dq_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                          size_t group_size, const float* const* a, const uint8_t* w,
                          const void* sz, size_t sz_stride, const float* bias, void* c,
                          ptrdiff_t c_stride) {
  (void)group_size, (void)sz, (void)sz_stride;
  char* cr[8];
  for (size_t i = 0; i < R; i++) cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
  const float* panel = (const float*)w;
  for (size_t p = 0; p < (nc + 31) / 32; p++, panel += kc * 32) {
    __m512 acc[8][8];
    for (size_t i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const float* wk = panel;
    for (size_t k = 0; k < kc; k++, wk += 32) {
      _mm_prefetch((const char*)wk + QK_PREFETCH_BYTES, _MM_HINT_T0);
      _mm_prefetch((const char*)wk + 64 + QK_PREFETCH_BYTES, _MM_HINT_T0);
      const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
      for (size_t i = 0; i < R; i++) {
        const __m512 xv = qk512_broadcast(&a[i][k]);
        acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
      }
    }
    qk512_qb4w_store(R, 1, DT, p, nc, bias, cr, acc);
  }
}

QK_DEFINE_INT4_UKERNEL(qk_woq_f32dq_qb4w_gemm_ukernel_8x32c1__avx512, f32dq_rows, 8)
