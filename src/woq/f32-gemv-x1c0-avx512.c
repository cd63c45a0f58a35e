/*
 * f32-gemv-x1c0-avx512.c -- WoQ GEMV micro-kernel 8x1c0 on the *unpacked*
 * weight, AVX-512 F/BW + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: "panels" of one column holding all of K, i.e. w is the caller's
 * row-major (N, K) int8 matrix itself and needs no packing.  x in f32, rows
 * on 64-byte lines (the driver converts f16 and bf16 rows once per row
 * block, convert_x, and copies f32 ones when a row is off a line:
 * QK_TRAIT_LINE_ALIGNED_X).
 * 16-wide fp32 FMA partial sums along k, each weight step widened
 * in-register once and shared by every row.  The K tail uses masked
 * loads: nothing is read past a row of x or w.  Up to 8 rows, specialised
 * for each mr (1..8), so fewer rows cost fewer FMAs; the columns per step
 * (4, 3 above 4 rows: 24 sums in zmm registers), prefetches and epilogue
 * (a horizontal sum per output, scale (multiply), bias (add), one
 * rounding to the output dtype) are gemv-rows-avx512.h's.
 */
#include <string.h>

#include "io-avx512.h"
#include "ukernel-define.h"

#define GEMV_K_STEP 16
typedef float gemv_x;

/* 16 int8 of a weight row from k as f32: all 16, or (MASKED) those that
 * mask selects. */
QK_INLINE __m512 load_w(const int MASKED, const int8_t* row, size_t k, __mmask16 mask) {
  return qk512_i8x16_to_f32(MASKED ? _mm_maskz_loadu_epi8(mask, row + k)
                                   : _mm_loadu_si128((const __m128i*)(row + k)));
}

/* One step of 16 k for R rows and C columns: acc[i][j] += x_i[k..] *
 * w_j[k..]; MASKED: only the first `left` k (the K tail; plain loads
 * elsewhere, which cost no ALU uop). */
QK_INLINE void gemv_step(const size_t R, const size_t C, const int MASKED, __m512 acc[8][4],
                         const float* const* ar, const int8_t* const* wr, size_t k, size_t left) {
  const __mmask16 mask = qk512_mask(left);
  __m512 wv[4];
#pragma GCC unroll 4
  for (size_t j = 0; j < C; j++) wv[j] = load_w(MASKED, wr[j], k, mask);
#pragma GCC unroll 8
  for (size_t i = 0; i < R; i++) {
    __m512 xv = MASKED ? _mm512_maskz_loadu_ps(mask, ar[i] + k) : _mm512_loadu_ps(ar[i] + k);
    QK512_IN_REGISTER(xv);
#pragma GCC unroll 4
    for (size_t j = 0; j < C; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

#include "gemv-rows-avx512.h"

QK_DEFINE_UKERNEL_ROWS(qk_woq_f32_gemv_ukernel_8x1c0__avx512, gemv_rows, 8)
