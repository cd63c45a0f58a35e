/*
 * bf16-gemv-x1c0-avx512bf16.c -- WoQ GEMV micro-kernel 8x1c0 on the
 * *unpacked* weight, AVX-512 F/BW/VL + AVX512_BF16 (vdpbf16ps).
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: w is the caller's row-major (N, K) int8 matrix itself, bf16 x
 * only, read as it is (no conversion; rows on 64-byte lines,
 * QK_TRAIT_LINE_ALIGNED_X: the driver copies them when one is off a
 * line).  Per step of 32 k, each weight
 * row's 32 int8 are widened in-register to 32 bf16 (exact: |w| <= 128
 * needs 8 significant bits), in the order of x's row, so that lane l of
 * vdpbf16ps adds x[k+2l] w[k+2l] + x[k+2l+1] w[k+2l+1]; the widened row
 * serves every row of x, whose 32 bf16 are one plain load.  vdpbf16ps
 * treats bf16 subnormals as zero and flushes subnormal results (DAZ/FTZ:
 * docs/semantics.rst bounds the error).  The K tail uses masked loads:
 * nothing is read past a row of x or w.  Up to 8 rows, specialised for
 * each mr (1..8), so fewer rows cost fewer vdpbf16ps; the columns per
 * step, prefetches and epilogue (a horizontal sum per output, scale,
 * bias, one rounding to bf16) are gemv-rows-avx512.h's.
 */
#include "io-avx512.h"
#include "ukernel-define.h"

#define GEMV_K_STEP 32
typedef uint16_t gemv_x; /* bf16 bits */

/* 32 int8 of a weight row from k as 32 bf16 in order: all 32, or (MASKED)
 * those that mask selects, zero elsewhere.  idx: qk512_high_halves. */
QK_INLINE __m512bh load_w(const int MASKED, const int8_t* row, size_t k, __mmask32 mask,
                          __m512i idx) {
  return (__m512bh)(MASKED ? qk512_i8_to_bf16_masked(row + k, mask, idx)
                           : qk512_i8_to_bf16(row + k, idx));
}

/* One step of 32 k for R rows and C columns: acc[i][j] += x_i[k..] .
 * w_j[k..] by pairs; MASKED: only the first `left` k (the K tail). */
QK_INLINE void gemv_step(const size_t R, const size_t C, const int MASKED, __m512 acc[8][4],
                         const uint16_t* const* ar, const int8_t* const* wr, size_t k,
                         size_t left) {
  const __mmask32 mask = qk512_mask32(left);
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  __m512bh wv[4];
#pragma GCC unroll 4
  for (size_t j = 0; j < C; j++) wv[j] = load_w(MASKED, wr[j], k, mask, idx);
#pragma GCC unroll 8
  for (size_t i = 0; i < R; i++) {
    const __m512bh xv = (__m512bh)(MASKED ? _mm512_maskz_loadu_epi16(mask, ar[i] + k)
                                          : _mm512_loadu_si512(ar[i] + k));
#pragma GCC unroll 4
    for (size_t j = 0; j < C; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
  }
}

#include "gemv-rows-avx512.h"

QK_DEFINE_UKERNEL_ROWS_BF16(qk_woq_bf16_gemv_ukernel_8x1c0__avx512bf16, gemv_rows, 8)
