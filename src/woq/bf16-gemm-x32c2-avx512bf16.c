/*
 * bf16-gemm-x32c2-avx512bf16.c -- WoQ GEMM micro-kernels 1x32c2 and 8x32c2,
 * AVX-512 F/BW/VL + AVX512_BF16 (vdpbf16ps).
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 32,
 * kr = 2, bf16 x only.  Each k-group of 64 int8 is widened in-register to two
 * vectors of 32 bf16 (exact: |w| <= 128 needs 8 significant bits), already in
 * the (column, k pair) order vdpbf16ps wants; the pair (x[k], x[k+1]) is
 * broadcast as one 32-bit lane.  Accumulation in f32 by vdpbf16ps, which
 * treats bf16 subnormals as zero and flushes subnormal results (DAZ/FTZ):
 * docs/semantics.rst bounds that error.  Epilogue: scale (multiply), bias
 * (add), one rounding to bf16 (exact RNE, subnormals kept).  Rows mr..MR-1 duplicate row mr-1.
 */
#include <string.h>

#include "io-avx512.h"
#include "ukernel-define.h"

/* 64 int8 of a k-group -> two vectors of 16 columns x (k, k+1) bf16. */
QK_INLINE void widen_group(const int8_t* wp, __m512bh* b0, __m512bh* b1) {
  *b0 = _mm512_cvtne2ps_pbh(qk512_i8_to_f32(wp + 16), qk512_i8_to_f32(wp));
  *b1 = _mm512_cvtne2ps_pbh(qk512_i8_to_f32(wp + 48), qk512_i8_to_f32(wp + 32));
}

QK_INLINE void bf16_step(const size_t MR, __m512 acc[][2], const char* const* ar, const int8_t* wp,
                         size_t k, int both) {
  __m512bh b0, b1;
  widen_group(wp, &b0, &b1);
  for (size_t i = 0; i < MR; i++) {
    uint32_t pair = 0;
    memcpy(&pair, ar[i] + 2 * k, both ? 4 : 2);
    const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)pair);
    acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xv, b0);
    acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xv, b1);
  }
}

QK_INLINE void bf16_gemm_x32c2(const size_t MR, const qk_dtype DT, size_t mr, size_t nc, size_t kc,
                               const void* const* a, const int8_t* w, const float* scale,
                               const float* bias, void* c, ptrdiff_t c_stride) {
  (void)DT;
  const char* ar[8];
  char* cr[8];
  qk_clamp_rows(MR, mr, a, c, c_stride, ar, cr);
  const size_t kpairs = kc / 2, kp = (kc + 1) / 2 * 2;

  for (size_t n0 = 0; n0 < nc; n0 += 32, w += kp * 32) {
    __m512 acc[8][2];
    for (size_t i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const int8_t* wp = w;
    for (size_t kk = 0; kk < kpairs; kk++, wp += 64) {
      _mm_prefetch((const char*)wp + QK_PREFETCH_BYTES, _MM_HINT_T0);
      bf16_step(MR, acc, ar, wp, 2 * kk, 1);
    }
    if (kc & 1) bf16_step(MR, acc, ar, wp, kc - 1, 0);
    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_loadu_ps(scale + col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < MR; i++) {
        qk512_epilogue(cr[i], col, QK_BF16, acc[i][h], s, b, bias != NULL, mask);
      }
    }
  }
}

QK_DEFINE_UKERNEL_BF16(qk_woq_bf16_gemm_ukernel_1x32c2__avx512bf16, bf16_gemm_x32c2, 1)
QK_DEFINE_UKERNEL_BF16(qk_woq_bf16_gemm_ukernel_8x32c2__avx512bf16, bf16_gemm_x32c2, 8)
