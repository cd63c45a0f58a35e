/*
 * f32-qb4w-gemm-x32c1-avx512.c -- the WoQ GEMM micro-kernel 8x32c1 on int4
 * groupwise weights, AVX-512 F/BW/VL + FMA + F16C.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), the order of sums the header fixes for the f32_qb4w
 * kernels.  x arrives in f32 with its group sums (the driver converts it).
 * A panel's 16-byte row (one k) widens in-register to two vectors of 16
 * f32 values (qk512_qb4w_widen_f32): the low nibbles, columns 0..15, and the
 * whole bytes (one zero-extension, a vpermps lookup for the nibbles, a
 * conversion for the bytes: three instructions where the high nibbles
 * would take four), shared by the rows: one FMA per row and vector into
 * the group's sums.  At the end of each group the high nibbles' p, columns
 * 16..31, is (bytes' sum - low nibbles' sum) * 2^-4; then per row and
 * column, acc = fma(p, s, acc) then acc = fma(xs, z', acc), with s and
 * z' = fma(-8, s, z) read from scales_and_zeros in y's dtype (masked:
 * nothing beyond column nc).  The body is specialised for each mr in 1..8,
 * so no FMA is spent on a missing row; one row runs four panels at once and
 * two to four rows two, so that eight or more independent FMA chains hide
 * the FMA latency; with fewer panels in the call (one per chunk at large
 * K), as many groups run side by side (their sums are independent
 * chains).  Four k per step: one 64-byte line of each panel and group, one
 * prefetch.
 */
#include <immintrin.h>

#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"

/* One k of GS groups: per group s, the 16-byte rows at wk + s *
 * group_size * 16 + p * panel_bytes (p < P) widened and multiplied into
 * the sums ps[.][2P s ..] of MR rows (low nibbles, then bytes). */
QK_INLINE void qb4w_step(const size_t MR, const size_t P, const size_t GS, const uint8_t* wk,
                         size_t panel_bytes, size_t group_size, const float* const* ar, size_t k,
                         __m512 table, __m512 ps[8][8]) {
#pragma GCC unroll 4
  for (size_t s = 0; s < GS; s++)
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++) {
      __m512 q0, q1;
      qk512_qb4w_widen_f32(1, wk + s * group_size * 16 + p * panel_bytes, table, &q0, &q1);
#pragma GCC unroll 8
      for (size_t i = 0; i < MR; i++) {
        const __m512 xv = qk512_broadcast(&ar[i][k + s * group_size]);
        ps[i][2 * P * s + 2 * p] = _mm512_fmadd_ps(xv, q0, ps[i][2 * P * s + 2 * p]);
        ps[i][2 * P * s + 2 * p + 1] = _mm512_fmadd_ps(xv, q1, ps[i][2 * P * s + 2 * p + 1]);
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
  const __m512 table = _mm512_load_ps(qk512_qb4w_f32_of_q);
  if ((g + GS) * group_size < kc) /* the next groups' scales and zeros, fetched now */
    qk512_qb4w_prefetch_params(P, GS, DT, g + GS, p0, sz, sz_stride);
  __m512 ps[8][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * P * GS; v++) ps[i][v] = _mm512_setzero_ps();
  /* groups are multiples of 32 (the registry's), so of 4 */
  const uint8_t* wk = w0 + g * group_size * 16;
  for (size_t k = g * group_size; k < (g + 1) * group_size; k += 4, wk += 64) {
    for (size_t s = 0; s < GS; s++)
      for (size_t p = 0; p < P; p++)
        _mm_prefetch((const char*)wk + s * group_size * 16 + p * panel_bytes + QK_PREFETCH_BYTES,
                     _MM_HINT_T0);
#pragma GCC unroll 4
    for (size_t u = 0; u < 4; u++)
      qb4w_step(MR, P, GS, wk + u * 16, panel_bytes, group_size, ar, k + u, table, ps);
  }
  /* the high nibbles' p from the bytes' sums */
  const __m512 sixteenth = _mm512_set1_ps(0.0625f);
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 1; v < 2 * P * GS; v += 2)
      ps[i][v] = _mm512_mul_ps(_mm512_sub_ps(ps[i][v], ps[i][v - 1]), sixteenth);
  qk512_qb4w_apply_groups(MR, P, GS, DT, g, p0, nc, kc, ar, sz, sz_stride, ps, acc);
}

#include "qb4w-rows-avx512.h"

QK_DEFINE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512, qb4w_rows, 8)
