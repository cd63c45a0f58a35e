/*
 * bf16-gemm-x32c2-avx512bf16.c -- WoQ GEMM micro-kernels 1x32c2 and 8x32c2
 * on packed int8 panels, and bf16w 8x32c2 on widened bf16 panels, AVX-512
 * F/BW/VL + AVX512_BF16 (vdpbf16ps).
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 32,
 * kr = 2, bf16 x only.  Each k-group of 64 int8 is widened in-register to two
 * vectors of 32 bf16 (exact: |w| <= 128 needs 8 significant bits), already in
 * the (column, k pair) order vdpbf16ps wants (bf16w: loaded as the driver
 * widened it, the same two vectors, so every kernel here gives a row the
 * same bits); the pair (x[k], x[k+1]) is
 * broadcast as one 32-bit lane.  Accumulation in f32 by vdpbf16ps, one chain
 * per row and column over the k-groups in increasing k, which treats bf16
 * subnormals as zero and flushes subnormal results (DAZ/FTZ):
 * docs/semantics.rst bounds that error.  Epilogue: scale (multiply), bias
 * (add), one rounding to bf16 (exact RNE, subnormals kept).  The body is
 * specialised for each mr in 1..MR, so no vdpbf16ps goes to a missing row;
 * one row runs four panels at once and two or three rows two, so that eight
 * or more independent chains hide the latency of vdpbf16ps (every row gets
 * the same bits whatever the panels or rows beside it).
 */
#include <string.h>

#include "io-avx512.h"
#include "ukernel-define.h"

/* 64 int8 of a k-group -> two vectors of 16 columns x (k, k+1) bf16, the
 * high halves of the exact f32 values: up to 6 rows picked by vpermt2w,
 * from 7 rows packed by vcvtne2ps2bf16 (the same bits).  On a Zen 4 the
 * permutation leaves the widening ports less busy (0.88-0.90x the time at
 * 1-6 rows) but takes slots of the vdpbf16ps ones (1.02-1.04x at 8). */
QK_INLINE void widen_group(const size_t MR, const int8_t* wp, __m512bh* b0, __m512bh* b1) {
  if (MR <= 6) {
    const __m512i idx = _mm512_load_si512(qk512_high_halves);
    *b0 = (__m512bh)qk512_i8_to_bf16(wp, idx);
    *b1 = (__m512bh)qk512_i8_to_bf16(wp + 32, idx);
  } else {
    *b0 = _mm512_cvtne2ps_pbh(qk512_i8_to_f32(wp + 16), qk512_i8_to_f32(wp));
    *b1 = _mm512_cvtne2ps_pbh(qk512_i8_to_f32(wp + 48), qk512_i8_to_f32(wp + 32));
  }
}

/* One k-group (k and k + 1, or k alone when !both) of P panels of weights
 * of WB bytes, panel p's at wp + p * panel_bytes, for MR rows into
 * acc[i][2p], acc[i][2p + 1]. */
QK_INLINE void bf16_step(const size_t MR, const size_t P, const size_t WB, __m512 acc[8][8],
                         const char* const* ar, const int8_t* wp, size_t panel_bytes, size_t k,
                         int both) {
  __m512bh xv[8];
  for (size_t i = 0; i < MR; i++) {
    uint32_t pair = 0;
    memcpy(&pair, ar[i] + 2 * k, both ? 4 : 2);
    xv[i] = (__m512bh)_mm512_set1_epi32((int)pair);
  }
#pragma GCC unroll 4
  for (size_t p = 0; p < P; p++) {
    __m512bh b0, b1;
    if (WB == 1) {
      widen_group(MR, wp + p * panel_bytes, &b0, &b1);
    } else {
      b0 = (__m512bh)_mm512_loadu_si512(wp + p * panel_bytes);
      b1 = (__m512bh)_mm512_loadu_si512(wp + p * panel_bytes + 64);
    }
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; i++) {
      acc[i][2 * p] = _mm512_dpbf16_ps(acc[i][2 * p], xv[i], b0);
      acc[i][2 * p + 1] = _mm512_dpbf16_ps(acc[i][2 * p + 1], xv[i], b1);
    }
  }
}

/* P consecutive panels from panel p0 (w at panel 0) of weights of WB
 * bytes for MR rows. */
QK_INLINE void bf16_panels(const size_t MR, const size_t P, const size_t WB, size_t p0, size_t nc,
                           size_t kc, const char* const* ar, char* const* cr, const int8_t* w,
                           const float* scale, const float* bias) {
  const size_t kpairs = kc / 2, panel_bytes = qk_x32c2_panel_bytes(WB, kc);
  __m512 acc[8][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * P; v++) acc[i][v] = _mm512_setzero_ps();
  const int8_t* wp = w + p0 * panel_bytes;
  for (size_t kk = 0; kk < kpairs; kk++, wp += 64 * WB) {
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++)
#pragma GCC unroll 2
      for (size_t line = 0; line < WB; line++)
        qk_prefetch_stream(wp + p * panel_bytes + 64 * line, WB == 1 && MR == 1);
    bf16_step(MR, P, WB, acc, ar, wp, panel_bytes, 2 * kk, 1);
  }
  if (kc & 1) bf16_step(MR, P, WB, acc, ar, wp, panel_bytes, kc - 1, 0);
  for (size_t v = 0; v < 2 * P; v++) {
    const size_t col = 32 * (p0 + v / 2) + 16 * (v % 2);
    if (col >= nc) break;
    const __mmask16 mask = qk512_mask(nc - col);
    const __m512 s = _mm512_loadu_ps(scale + col);
    const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; i++)
      qk512_epilogue(cr[i], col, QK_BF16, acc[i][v], s, b, bias != NULL, mask);
  }
}

/* mr = MR rows over all nc columns of weights of WB bytes, P panels at a
 * time, then fewer. */
QK_INLINE void bf16_rows(const size_t MR, const size_t WB, size_t nc, size_t kc,
                         const void* const* a, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const char* ar[8];
  char* cr[8];
  for (size_t i = 0; i < MR; i++) {
    ar[i] = (const char*)a[i];
    cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
  }
#define BF16_PANELS(P, p) bf16_panels(MR, P, WB, p, nc, kc, ar, cr, w, scale, bias)
  QK_X32_PANEL_STEPS(MR, 3, nc, BF16_PANELS);
#undef BF16_PANELS
}

#define bf16_gemm_x32c2(R, DT, ...) bf16_rows(R, 1, __VA_ARGS__)
#define bf16w_gemm_x32c2(R, DT, ...) bf16_rows(R, 2, __VA_ARGS__)

QK_DEFINE_UKERNEL_ROWS_BF16(qk_woq_bf16_gemm_ukernel_1x32c2__avx512bf16, bf16_gemm_x32c2, 1)
QK_DEFINE_UKERNEL_ROWS_BF16(qk_woq_bf16_gemm_ukernel_8x32c2__avx512bf16, bf16_gemm_x32c2, 8)
QK_DEFINE_UKERNEL_ROWS_BF16(qk_woq_bf16w_gemm_ukernel_8x32c2__avx512bf16, bf16w_gemm_x32c2, 8)
