/*
 * f32-qb4w-gemm-x32c1-avx2.c -- the WoQ GEMM micro-kernel 6x32c1 on int4
 * groupwise weights, AVX2 + FMA + F16C.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), the order of sums the header fixes for the f32_qb4w
 * kernels.  x arrives in f32 with its group sums (the driver converts it).
 * A panel is walked in two halves: 8 bytes of each 16-byte row (one k)
 * widen in-register to two vectors of 8 f32 values, the low nibbles of
 * columns 8h..8h+7 (zero-extend, AND, convert) and the whole bytes (the
 * same zero-extension, convert; no shift), shared by the rows: one FMA per
 * row and vector into the group's sums (12 of the 16 ymm registers at 6
 * rows).  At the end of each group the high nibbles' p, columns
 * 16+8h..16+8h+7, is (bytes' sum - low nibbles' sum) * 2^-4; then per row
 * and column, acc = fma(p, s, acc) then acc = fma(xs, z', acc), with s and
 * z' = fma(-8, s, z) read from scales_and_zeros in y's dtype (acc lives
 * in L1 between groups).  The body is specialised for each mr in 1..6, so
 * no FMA is spent on a missing row.  One row runs four halves (two panels)
 * at once and two rows two halves (one panel), so that eight independent
 * FMA chains hide the FMA latency (one row on a single panel, as a chunk
 * at large K holds: two groups side by side, their sums independent
 * chains); one row also takes four k per step, one 64-byte line of each
 * panel and group, so that its loop is all vector work (measured in L2 on
 * a Zen 3: 1.05x the one-k loop at one row, 1.27x at two rows with two
 * halves against one, 2x for one row on one panel with two groups against
 * one; with the weight in DRAM the last is as fast as before).
 */
#include <immintrin.h>

#include "io-avx2.h"
#include "qb4w-avx2.h"
#include "qkern/woq_ukernels.h"

/* One k of GS groups: per group s, the 16-byte rows at wk + s *
 * group_bytes (and, for H > 2, panel_bytes further) widened and multiplied
 * into the sums ps[.][2H s ..] of MR rows (low nibbles, then bytes). */
QK_INLINE void qb4w_step(const size_t MR, const size_t H, const size_t GS, const uint8_t* wk,
                         size_t panel_bytes, size_t group_size, const float* const* xr, size_t k,
                         __m256i low, __m256 ps[6][8]) {
#pragma GCC unroll 2
  for (size_t s = 0; s < GS; s++)
#pragma GCC unroll 4
    for (size_t h = 0; h < H; h++) {
      const uint8_t* row = wk + s * group_size * 16 + h / 2 * panel_bytes + h % 2 * 8;
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)row));
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
      const __m256 q1 = _mm256_cvtepi32_ps(b); /* the whole bytes */
      for (size_t i = 0; i < MR; i++) {
        const __m256 xv = _mm256_broadcast_ss(xr[i] + k + s * group_size);
        ps[i][2 * H * s + 2 * h] = _mm256_fmadd_ps(xv, q0, ps[i][2 * H * s + 2 * h]);
        ps[i][2 * H * s + 2 * h + 1] = _mm256_fmadd_ps(xv, q1, ps[i][2 * H * s + 2 * h + 1]);
      }
    }
}

/* Groups g .. g + GS - 1 of H consecutive half panels (w at their first
 * half's first k-row, col their first columns) for MR rows, the products
 * of the groups side by side, each applied to acc in turn (see the top). */
QK_INLINE void qb4w_groups(const size_t MR, const size_t H, const size_t GS, const qk_dtype DT,
                           size_t g, size_t nc, size_t kc, size_t group_size,
                           const float* const* ar, const uint8_t* w, const size_t col[4][2],
                           const char* sz, size_t sz_stride, __m256i low, __m256* acc) {
  const size_t esize = qk_dtype_size(DT), panel_bytes = kc * 16;
  /* the next groups' scales and zeros are rows of sz away: fetched while
   * these products run */
  if ((g + GS) * group_size < kc)
    for (size_t s = 0; s < GS; s++)
      for (size_t h = 0; h < H; h += 2) {
        _mm_prefetch(sz + (g + GS + s) * sz_stride + col[h][0] * 2 * esize, _MM_HINT_T0);
        _mm_prefetch(sz + (g + GS + s) * sz_stride + col[h][1] * 2 * esize, _MM_HINT_T0);
      }
  __m256 ps[6][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * H * GS; v++) ps[i][v] = _mm256_setzero_ps();
  /* wk: k's 16-byte row in the first panel (the second panel's is
   * panel_bytes further, the next group's group_size * 16) */
  const uint8_t* wk = w + g * group_size * 16;
  const size_t k_end = (g + 1) * group_size;
  if (MR == 1) { /* four k per step (groups are multiples of 32): one
                    64-byte line of each panel and group */
    for (size_t k = g * group_size; k < k_end; k += 4, wk += 64) {
      for (size_t s = 0; s < GS; s++) {
        _mm_prefetch((const char*)wk + s * group_size * 16 + QK_PREFETCH_BYTES, _MM_HINT_T0);
        if (H > 2)
          _mm_prefetch((const char*)wk + s * group_size * 16 + panel_bytes + QK_PREFETCH_BYTES,
                       _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (size_t u = 0; u < 4; u++)
        qb4w_step(MR, H, GS, wk + u * 16, panel_bytes, group_size, ar, k + u, low, ps);
    }
  } else { /* one k per step (four would spill), a prefetch every fourth */
    for (size_t k = g * group_size; k < k_end; k++, wk += 16) {
      if ((k & 3) == 0) _mm_prefetch((const char*)wk + QK_PREFETCH_BYTES, _MM_HINT_T0);
      qb4w_step(MR, H, GS, wk, panel_bytes, group_size, ar, k, low, ps);
    }
  }
  /* the high nibbles' p from the bytes' sums */
  const __m256 sixteenth = _mm256_set1_ps(0.0625f);
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 1; v < 2 * H * GS; v += 2)
      ps[i][v] = _mm256_mul_ps(_mm256_sub_ps(ps[i][v], ps[i][v - 1]), sixteenth);
#pragma GCC unroll 2
  for (size_t s = 0; s < GS; s++) {
    const char* row = sz + (g + s) * sz_stride;
#pragma GCC unroll 8
    for (size_t v = 0; v < 2 * H; v++) {
      __m256 sc, zp;
      qk256_qb4w_load_params(row, col[v / 2][v % 2], nc, DT, &sc, &zp);
#pragma GCC unroll 6
      for (size_t i = 0; i < MR; i++) {
        __m256* a = &acc[i * 2 * H + v];
        *a = _mm256_fmadd_ps(ps[i][2 * H * s + v], sc, *a);
        *a = _mm256_fmadd_ps(_mm256_broadcast_ss(ar[i] + kc + g + s), zp, *a);
      }
    }
  }
}

/* H consecutive half panels from half h0 (half h: panel h / 2, byte
 * offset 8 * (h % 2) of each row) for MR rows (see the top). */
QK_INLINE void qb4w_halves(const size_t MR, const size_t H, const qk_dtype DT, size_t h0, size_t nc,
                           size_t kc, size_t group_size, const float* const* ar, char* const* cr,
                           const uint8_t* w, const char* sz, size_t sz_stride, const float* bias) {
  const size_t groups = kc / group_size;
  const __m256i low = _mm256_set1_epi32(15);
  /* col: each half's first two columns */
  size_t col[4][2];
  for (size_t h = 0; h < H; h++) {
    col[h][0] = (h0 + h) / 2 * 32 + (h0 + h) % 2 * 8;
    col[h][1] = col[h][0] + 16;
  }
  const uint8_t* wh = w + h0 / 2 * kc * 16 + h0 % 2 * 8;
  __m256 acc[6 * 8] __attribute__((aligned(32)));
  for (size_t i = 0; i < MR * H * 2; i++) acc[i] = _mm256_setzero_ps();
  /* one row on one panel: two groups at once, eight FMA chains */
  const size_t GS = MR == 1 && H == 2 ? 2 : 1;
  size_t g = 0;
  for (; g + GS <= groups; g += GS)
    qb4w_groups(MR, H, GS, DT, g, nc, kc, group_size, ar, wh, col, sz, sz_stride, low, acc);
  if (g < groups)
    qb4w_groups(MR, H, 1, DT, g, nc, kc, group_size, ar, wh, col, sz, sz_stride, low, acc);
#pragma GCC unroll 8
  for (size_t v = 0; v < 2 * H; v++) {
    const size_t c = col[v / 2][v % 2];
    if (c >= nc) continue;
    const __m256 b = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (size_t i = 0; i < MR; i++) {
      __m256 y = acc[i * 2 * H + v];
      if (bias) y = _mm256_add_ps(y, b);
      qk256_store_row(cr[i], c, DT, y, nc - c);
    }
  }
}

/* mr = MR rows over all nc columns, half panel by half panel. */
QK_INLINE void qb4w_rows(const size_t MR, const qk_dtype DT, size_t nc, size_t kc,
                         size_t group_size, const float* const* a, const uint8_t* w, const void* sz,
                         size_t sz_stride, const float* bias, void* c, ptrdiff_t c_stride) {
  char* cr[6];
  for (size_t i = 0; i < MR; i++) cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
  /* halves per step: eight independent sums (2 * MR * H) or more hide the
   * FMA latency (three rows stay at one half: two would spill) */
  const size_t H = MR == 1 ? 4 : MR == 2 ? 2 : 1, halves = (nc + 31) / 32 * 2;
  size_t h = 0;
  for (; h + H <= halves; h += H)
    qb4w_halves(MR, H, DT, h, nc, kc, group_size, a, cr, w, sz, sz_stride, bias);
  if (H == 4 && h < halves) /* a last single panel (the only one of a chunk at large K) */
    qb4w_halves(MR, 2, DT, h, nc, kc, group_size, a, cr, w, sz, sz_stride, bias);
}

QK_DEFINE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_6x32c1__avx2, qb4w_rows, 6)
