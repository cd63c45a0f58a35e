/*
 * bf16-qb4w-gemm-x32c1-avx512bf16.c -- the WoQ GEMM micro-kernel 8x32c1 on
 * int4 groupwise weights for bf16 x, AVX-512 F/BW/VL + AVX512_BF16
 * (vdpbf16ps) + AVX512_VBMI (vpermb).
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), bf16 x only, which arrives in f32 (exact) with its
 * group sums; the order of sums of the "bf16_qb4w" kernels in the header.
 * Per 32 k of a group, each row's 32 x values are narrowed back to bf16
 * (exact) into a buffer of 16 (x[k], x[k+1]) pairs, each later broadcast
 * as one 32-bit lane.  A panel's 16-byte rows k and k+1 (32 bytes) widen
 * in-register to two vectors of 16 columns x (q[k], q[k+1]) bf16, columns
 * 0..15 and 16..31: one byte permutation that pairs the two rows column by
 * column as words (vpermb, zeroing the high bytes), and a
 * lookup of q -> bf16(q) (exact) of the words (low nibbles, no AND:
 * qk512_qb4w_bf16_of_q) and of the words shifted right by 4 (the
 * permutation takes the place of qk512_qb4w_widen_pair's zero-extension
 * and word permutation, one port slot fewer); shared by the rows, one
 * vdpbf16ps per row and vector adds x[k+1] q[k+1], then x[k] q[k] (exact
 * products, each add rounded, DAZ/FTZ) into the group's partial sums p.
 * Twice the multiply-adds of an FMA per instruction.  The group epilogue
 * is the f32 kernels': acc = fma(p, s, acc), acc = fma(xs, z', acc)
 * (qb4w-avx512.h).  The body is specialised for each mr in 1..8; the
 * panels and groups run at once as in f32_qb4w_gemm_8x32c1__avx512
 * (qb4w-rows-avx512.h).
 */
#include <immintrin.h>

#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

/* Byte indices for vpermb: word 2c of the result is byte c of row k (the
 * first 16 loaded), word 2c + 1 byte c of row k + 1 (the next 16); the
 * high byte of each word (index 0 here) is zeroed by the mask. */
static const uint8_t pair_rows_as_words[64] __attribute__((aligned(64))) = {
    0,  0, 16, 0, 1,  0, 17, 0, 2,  0, 18, 0, 3,  0, 19, 0, 4,  0, 20, 0, 5,  0,
    21, 0, 6,  0, 22, 0, 7,  0, 23, 0, 8,  0, 24, 0, 9,  0, 25, 0, 10, 0, 26, 0,
    11, 0, 27, 0, 12, 0, 28, 0, 13, 0, 29, 0, 14, 0, 30, 0, 15, 0, 31, 0};

/* The 32 bytes of packed int4 rows k and k + 1 at row -> their bf16 pairs
 * (qk512_qb4w_bf16_pairs) after one vpermb by pairs (pair_rows_as_words,
 * loaded) that zeroes the odd bytes: qk512_qb4w_widen_pair's bits. */
QK_INLINE void widen_pair(const uint8_t* row, __m512i pairs, __m512i table, __m512i* q0,
                          __m512i* q1) {
  const __mmask64 low_bytes = 0x5555555555555555ull;
  const __m256i rows = _mm256_loadu_si256((const __m256i*)row);
  qk512_qb4w_bf16_pairs(
      _mm512_maskz_permutexvar_epi8(low_bytes, pairs, _mm512_castsi256_si512(rows)), table, q0, q1);
}

/* The 32 x values of MR rows from k (f32 holding bf16 values) as 16 bf16
 * pairs per row, xb[i][0..15]. */
QK_INLINE void narrow_x32(const size_t MR, const float* const* ar, size_t k, uint32_t xb[8][16]) {
  const __m512i high = _mm512_load_si512(qk512_high_halves);
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; i++)
    _mm512_store_si512(xb[i], qk512_high_halves_of(_mm512_loadu_ps(ar[i] + k),
                                                   _mm512_loadu_ps(ar[i] + k + 16), high));
}

/* One pair k, k + 1 (the j-th of the current 32 k) of GS groups: per
 * group s, the rows at wk + s * group_size * 16 + p * panel_bytes (p < P)
 * widened and multiplied into the partial sums ps[.][2P s ..] of MR
 * rows. */
QK_INLINE void qb4w_pair_step(const size_t MR, const size_t P, const size_t GS, const uint8_t* wk,
                              size_t panel_bytes, size_t group_size, const uint32_t xb[4][8][16],
                              size_t j, __m512i pairs, __m512i table, __m512 ps[8][8]) {
#pragma GCC unroll 4
  for (size_t s = 0; s < GS; s++)
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++) {
      __m512i q0i, q1i;
      widen_pair(wk + s * group_size * 16 + p * panel_bytes, pairs, table, &q0i, &q1i);
      const __m512bh q0 = (__m512bh)q0i, q1 = (__m512bh)q1i;
#pragma GCC unroll 8
      for (size_t i = 0; i < MR; i++) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[s][i][j]);
        ps[i][2 * P * s + 2 * p] = _mm512_dpbf16_ps(ps[i][2 * P * s + 2 * p], q0, xv);
        ps[i][2 * P * s + 2 * p + 1] = _mm512_dpbf16_ps(ps[i][2 * P * s + 2 * p + 1], q1, xv);
      }
    }
}

/* Groups g .. g + GS - 1 of P consecutive panels from panel p0 (w0 at its
 * first k-row) for MR rows, the products of the groups side by side, each
 * applied to acc in turn (see the top); called by qb4w-rows-avx512.h. */
QK_INLINE void qb4w_groups(const size_t MR, const size_t P, const size_t GS, const qk_dtype DT,
                           size_t g, size_t p0, size_t nc, size_t kc, size_t group_size,
                           const float* const* ar, const uint8_t* w0, const char* sz,
                           size_t sz_stride, __m512 acc[8][8]) {
  const size_t panel_bytes = kc * 16;
  const __m512i pairs = _mm512_load_si512(pair_rows_as_words);
  const __m512i table = _mm512_load_si512(qk512_qb4w_bf16_of_q);
  if ((g + GS) * group_size < kc) /* the next groups' scales and zeros, fetched now */
    qk512_qb4w_prefetch_params(P, GS, DT, g + GS, p0, sz, sz_stride);
  __m512 ps[8][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * P * GS; v++) ps[i][v] = _mm512_setzero_ps();
  uint32_t xb[4][8][16] __attribute__((aligned(64)));
  /* groups are multiples of 32 (the registry's) */
  for (size_t k0 = g * group_size; k0 < (g + 1) * group_size; k0 += 32) {
    for (size_t s = 0; s < GS; s++) narrow_x32(MR, ar, k0 + s * group_size, xb[s]);
    const uint8_t* wk = w0 + k0 * 16;
    for (size_t j = 0; j < 16; j += 2, wk += 64) { /* one 64-byte line of each panel and group */
#pragma GCC unroll 4
      for (size_t s = 0; s < GS; s++)
#pragma GCC unroll 4
        for (size_t p = 0; p < P; p++)
          _mm_prefetch((const char*)wk + s * group_size * 16 + p * panel_bytes + QK_PREFETCH_BYTES,
                       _MM_HINT_T0);
      qb4w_pair_step(MR, P, GS, wk, panel_bytes, group_size, xb, j, pairs, table, ps);
      qb4w_pair_step(MR, P, GS, wk + 32, panel_bytes, group_size, xb, j + 1, pairs, table, ps);
    }
  }
  qk512_qb4w_apply_groups(MR, P, GS, DT, g, p0, nc, kc, ar, sz, sz_stride, ps, acc);
}

#include "qb4w-rows-avx512.h"

QK_DEFINE_INT4_UKERNEL_BF16(qk_woq_bf16_qb4w_gemm_ukernel_8x32c1__avx512bf16, qb4w_rows, 8)
