/*
 * f32-gemv-x1c0-avx2.c -- WoQ GEMV micro-kernel 8x1c0 on the *unpacked*
 * weight, AVX2 + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: w is the caller's row-major (N, K) int8 matrix itself, unpacked.
 * x in f32, rows on 64-byte lines (the driver converts f16 and bf16 rows
 * once per row block, convert_x, and copies f32 ones when a row is off a
 * line: QK_TRAIT_LINE_ALIGNED_X).  For each of up to 6 rows of x and C
 * columns at a time (C = 4 for 1-2 rows, 3 for 3-4, 2 for 5-6: at most
 * 12 sums in the 16 ymm registers, and each row of x, which no longer
 * fits L1 from 3 rows, read once per C columns), 8-wide fp32 FMA partial
 * sums along k (int8 widened in-register, each x vector loaded once a
 * step and shared by the columns), a horizontal sum at the end (lanes
 * 0..7 added pairwise, in one fixed order), then scale (multiply), bias
 * (add) and one rounding to the output dtype.  7-8 rows run as 4 rows,
 * then the rest: with fewer columns a step, the rows of x would stream
 * from L2 at a vector per FMA.  The K tail (K mod 8) goes through
 * zero-padded copies: nothing is read past a row of x or w.  Each of the
 * C rows of w is prefetched into L2 QK_GEMV_L2_PREFETCH_BYTES ahead and,
 * at 5-6 rows only, into L1 ROW_L1_PREFETCH_BYTES ahead in the row.  The
 * body is specialised for each mr (1..8), so fewer rows cost fewer FMAs;
 * the columns per step change no sum, so every mr gives a row the same
 * bits.
 */
#include <immintrin.h>
#include <string.h>

#include "io-avx2.h"
#include "scalar-convert.h"

/* ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)): one fixed order. */
QK_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* How far ahead in its own row a tile of 2 columns (5-6 rows) prefetches
 * each row of w into L1, in bytes: there the FMAs, not DRAM, set the pace,
 * and the next tiles' lines, fetched a tile's K / 8 steps early, left L1
 * again under the rows of x streaming through it (on a Zen 4, 0.96-0.97
 * of the time).  Tiles of 3-4 columns (1-4 rows) prefetch nothing into
 * L1: x (16 KiB at K = 4096) holds half of L1, and a line fetched ahead
 * waits there beside the lines in use (at K = 4096 the C rows' lines of
 * one k share an L1 set).  On a Zen 3, cold weights, against prefetching
 * the same k two tiles on, they took 0.91-0.98 of the time at K = 4096
 * (1, 2 and 4 rows) and, at one row, K = 11008, medians of 0.75-0.78;
 * 512 bytes on in the row took 1.04-1.06x at one row.  (A Zen 4, whose
 * own GEMV is the AVX-512 one, preferred two tiles on to 512 bytes on at
 * one or two rows, 1.13-1.18x, capped to AVX2; it was not timed without
 * the L1 prefetch.) */
#define ROW_L1_PREFETCH_BYTES 512

/* R (<= 6) rows times C columns from n0: sums over whole steps of 8 k,
 * then the tail through zero-padded copies of the last K mod 8 values. */
QK_INLINE void gemv_tile(const size_t R, const size_t C, const qk_dtype DT, size_t n0, size_t nc,
                         size_t kc, const float* const* ar, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const int8_t* wr[4];
  for (size_t j = 0; j < C; j++) wr[j] = w + (n0 + j < nc ? n0 + j : nc - 1) * kc;
  __m256 acc[6][4];
  for (size_t i = 0; i < R; i++)
    for (size_t j = 0; j < C; j++) acc[i][j] = _mm256_setzero_ps();
  const size_t k_whole = kc / 8 * 8;
  /* Rows of x through pointers that move with k (GCC otherwise addresses
   * them with base, index and displacement) and, for 5-6 rows, each x
   * vector held in a register (GCC folds it into both FMAs otherwise):
   * with the L1 prefetch in the row, 5-6 rows took 0.88 of the time with
   * the weight in L2 and 0.92 on cold weights, on a Zen 4; the register
   * alone cost 1-4 rows up to 1.06 at one row, cold. */
  const float* xp[6];
  for (size_t i = 0; i < R; i++) xp[i] = ar[i];
  for (size_t k = 0; k < k_whole; k += 8) {
    if ((k & 63) == 0)
      for (size_t j = 0; j < C; j++) {
        if (C == 2) _mm_prefetch((const char*)wr[j] + k + ROW_L1_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char*)wr[j] + k + QK_GEMV_L2_PREFETCH_BYTES, _MM_HINT_T1);
      }
    __m256 wv[4];
    for (size_t j = 0; j < C; j++) wv[j] = qk256_i8_to_f32(wr[j] + k);
    for (size_t i = 0; i < R; i++) {
      __m256 xv = _mm256_loadu_ps(xp[i]);
      xp[i] += 8;
      if (C == 2) QK_IN_REGISTER(xv);
      for (size_t j = 0; j < C; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k_whole < kc) {
    const size_t left = kc - k_whole;
    int8_t wt[4][8] = {{0}};
    float xt[6][8] = {{0}};
    for (size_t j = 0; j < C; j++) memcpy(wt[j], wr[j] + k_whole, left);
    for (size_t i = 0; i < R; i++) memcpy(xt[i], ar[i] + k_whole, left * sizeof(float));
    for (size_t i = 0; i < R; i++) {
      const __m256 xv = _mm256_loadu_ps(xt[i]);
      for (size_t j = 0; j < C; j++)
        acc[i][j] = _mm256_fmadd_ps(xv, qk256_i8_to_f32(wt[j]), acc[i][j]);
    }
  }
  /* The sums leave their registers through constant indices only (GCC
   * otherwise keeps them on the stack through the k loop). */
  float sums[6][4];
#pragma GCC unroll 6
  for (size_t i = 0; i < R; i++)
#pragma GCC unroll 4
    for (size_t j = 0; j < C; j++) sums[i][j] = hsum(acc[i][j]);
  for (size_t i = 0; i < R; i++) {
    char* crow = (char*)c + (ptrdiff_t)i * c_stride;
    for (size_t j = 0; j < C && n0 + j < nc; j++) {
      float v = sums[i][j] * scale[n0 + j];
      if (bias) v = v + bias[n0 + j];
      qk_store_from_f32(crow, n0 + j, DT, v);
    }
  }
}

/* R (<= 6) rows over all nc columns, C at a time. */
QK_INLINE void gemv_tiles(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                          const float* const* ar, const int8_t* w, const float* scale,
                          const float* bias, void* c, ptrdiff_t c_stride) {
  const size_t C = R <= 2 ? 4 : R <= 4 ? 3 : 2;
  for (size_t n0 = 0; n0 < nc; n0 += C)
    gemv_tile(R, C, DT, n0, nc, kc, ar, w, scale, bias, c, c_stride);
}

QK_INLINE void gemv_rows(const size_t R, const qk_dtype DT, size_t nc, size_t kc,
                         const void* const* a, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  const float* ar[8];
  for (size_t i = 0; i < R; i++) ar[i] = (const float*)a[i];
  if (R <= 6) {
    gemv_tiles(R, DT, nc, kc, ar, w, scale, bias, c, c_stride);
  } else {
    gemv_tiles(4, DT, nc, kc, ar, w, scale, bias, c, c_stride);
    gemv_tiles(R - 4, DT, nc, kc, ar + 4, w, scale, bias, (char*)c + 4 * c_stride, c_stride);
  }
}

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemv_ukernel_8x1c0__avx2, gemv_rows, 8)
