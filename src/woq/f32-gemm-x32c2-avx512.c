/*
 * f32-gemm-x32c2-avx512.c -- WoQ GEMM micro-kernels 1x32c2, 4x32c2 and
 * 6x32c2 on packed int8 panels, and f32w 6x32c2 on widened f32 panels,
 * AVX-512 F/BW/VL + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 32,
 * kr = 2.  x in f32 (the driver converts f16 and bf16 rows once per row
 * block: convert_x); fp32 FMA accumulation; y in dt.
 *
 * Each 16-byte run of a k-group holds 8 columns x (k even, k odd); it is
 * widened to 16 lanes (f32w: loaded as the driver widened it, 64 bytes)
 * and multiplied by the broadcast pair (x[k], x[k+1]), so every
 * accumulator lane is a (column, k parity) partial sum.  The epilogue adds
 * the even and odd lanes of each column, then applies scale (multiply) and
 * bias (add) and rounds once to the output dtype.  The four widened vectors
 * of a k-group serve every row: 6 rows hold 24 of the 32 zmm registers in
 * sums (the 4x16 tile's four conversions per 16 FMAs become four per 24;
 * none in f32w).  The body is specialised for each mr (no FMA is spent on
 * a missing row).  One row runs four panels at once: with cold weights its
 * single stream left DRAM idle between misses (four streams and the L2
 * prefetch of qk_prefetch_stream, 4096 x 4096, one thread on a Zen 4: 0.69-0.78
 * of the time of one panel at a time with the L1 prefetch alone).  Every
 * kernel here sums each column in the same order, so all of them give a
 * row the same bits whatever the panels beside it.
 */
#include <string.h>

#include "io-avx512.h"
#include "ukernel-define.h"

/* Broadcast (x[k], x[k+1]) of an f32 row to all 8 lane pairs; x[k+1] = 0
 * if !both. */
QK_INLINE __m512 bcast_pair(const float* row, size_t k, int both) {
  uint64_t pair = 0;
  memcpy(&pair, row + k, both ? 8 : 4);
  return _mm512_castsi512_ps(_mm512_set1_epi64((long long)pair));
}

/* 16 weights of a k-group (run j) as f32. */
QK_INLINE __m512 load_run(const size_t WB, const int8_t* wp, size_t j) {
  return WB == 1 ? qk512_i8_to_f32(wp + 16 * j) : _mm512_loadu_ps((const float*)wp + 16 * j);
}

/* One k-group (64 weights of WB bytes at wp): acc[i] += w[k..k+1] *
 * (x_i[k], x_i[k+1]). */
QK_INLINE void f32_step(const size_t MR, const size_t WB, __m512 acc[][4], const float* const* ar,
                        const int8_t* wp, size_t k, int both) {
  const __m512 w0 = load_run(WB, wp, 0), w1 = load_run(WB, wp, 1);
  const __m512 w2 = load_run(WB, wp, 2), w3 = load_run(WB, wp, 3);
  for (size_t i = 0; i < MR; i++) {
    const __m512 xv = bcast_pair(ar[i], k, both);
    acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
    acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
    acc[i][2] = _mm512_fmadd_ps(xv, w2, acc[i][2]);
    acc[i][3] = _mm512_fmadd_ps(xv, w3, acc[i][3]);
  }
}

/* P consecutive panels from column n0 (w at the first) for MR rows
 * (P * MR <= 6), weights of WB bytes. */
QK_INLINE void x32c2_panels(const size_t MR, const size_t P, const size_t WB, const qk_dtype DT,
                            size_t n0, size_t nc, size_t kc, const float* const* ar,
                            char* const* cr, const int8_t* w, const float* scale,
                            const float* bias) {
  const size_t kpairs = kc / 2, panel_bytes = qk_x32c2_panel_bytes(WB, kc);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 acc[6][4];
  for (size_t i = 0; i < P * MR; i++)
    for (size_t j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
  const int8_t* wp = w;
  for (size_t kk = 0; kk < kpairs; kk++, wp += 64 * WB) {
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++) {
      for (size_t line = 0; line < WB; line++)
        qk_prefetch_stream(wp + p * panel_bytes + 64 * line, WB == 1 && MR <= 2);
      f32_step(MR, WB, acc + p * MR, ar, wp + p * panel_bytes, 2 * kk, 1);
    }
  }
  if (kc & 1)
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++)
      f32_step(MR, WB, acc + p * MR, ar, wp + p * panel_bytes, kc - 1, 0);
#pragma GCC unroll 4
  for (size_t p = 0; p < P; p++)
    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 32 * p + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_loadu_ps(scale + col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < MR; i++) {
        const __m512 lo = acc[p * MR + i][2 * h], hi = acc[p * MR + i][2 * h + 1];
        const __m512 sum = _mm512_add_ps(_mm512_permutex2var_ps(lo, even, hi),
                                         _mm512_permutex2var_ps(lo, odd, hi));
        qk512_epilogue(cr[i], col, DT, sum, s, b, bias != NULL, mask);
      }
    }
}

/* MR rows (a compile-time constant, QK_DEFINE_UKERNEL_ROWS), weights of
 * WB bytes: one row runs four panels at once, so that four streams of
 * weights are in flight. */
QK_INLINE void x32c2(const size_t MR, const size_t WB, const qk_dtype DT, size_t nc, size_t kc,
                     const void* const* a, const int8_t* w, const float* scale, const float* bias,
                     void* c, ptrdiff_t c_stride) {
  const float* ar[6];
  char* cr[6];
  qk_row_pointers(MR, a, c, c_stride, ar, cr);
  const size_t P = MR == 1 ? 4 : 1, panel_bytes = qk_x32c2_panel_bytes(WB, kc);
  size_t n0 = 0;
  if (P > 1)
    for (; n0 + 32 * (P - 1) < nc; n0 += 32 * P, w += P * panel_bytes)
      x32c2_panels(MR, P, WB, DT, n0, nc, kc, ar, cr, w, scale, bias);
  for (; n0 < nc; n0 += 32, w += panel_bytes)
    x32c2_panels(MR, 1, WB, DT, n0, nc, kc, ar, cr, w, scale, bias);
}

#define f32_gemm_x32c2(R, DT, ...) x32c2(R, 1, DT, __VA_ARGS__)
#define f32w_gemm_x32c2(R, DT, ...) x32c2(R, 4, DT, __VA_ARGS__)

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_1x32c2__avx512, f32_gemm_x32c2, 1)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_4x32c2__avx512, f32_gemm_x32c2, 4)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemm_ukernel_6x32c2__avx512, f32_gemm_x32c2, 6)
QK_DEFINE_UKERNEL_ROWS(qk_woq_f32w_gemm_ukernel_6x32c2__avx512, f32w_gemm_x32c2, 6)
