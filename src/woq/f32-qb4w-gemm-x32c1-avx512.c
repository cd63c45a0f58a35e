/*
 * f32-qb4w-gemm-x32c1-avx512.c -- the WoQ GEMM micro-kernel 8x32c1 on int4
 * groupwise weights, AVX-512 F/BW/VL + FMA + F16C.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), the order of sums the header fixes for every int4
 * kernel.  x arrives in f32 with its group sums (the driver converts it).
 * A panel's 16-byte row (one k) widens in-register to two vectors of 16
 * f32 q values, columns 0..15 and 16..31 (one zero-extension, an AND and
 * a shift, two conversions: half the AVX2 kernel's µops per weight),
 * shared by the rows: one FMA per row and vector into the group's partial
 * sums p.  At the end of each group, per row and column, acc = fma(p, s,
 * acc) then acc = fma(xs, z', acc), with s and z' = fma(-8, s, z) read from
 * scales_and_zeros in y's dtype (masked: nothing beyond column nc).  The
 * body is specialised for each mr in 1..8, so no FMA is spent on a missing
 * row; one row runs four panels at once and two or three rows two, so that
 * eight or more independent FMA chains hide the FMA latency; with fewer
 * panels in the call (one per chunk at large K), as many groups run side
 * by side (their sums are independent chains).  Four k per step: one
 * 64-byte line of each panel and group, one prefetch.
 */
#include <immintrin.h>

#include "io-avx512.h"
#include "qkern/woq_ukernels.h"

/* The scales s and z' = fma(-8, s, z) of the first `count` (1..16) of 16
 * columns, from their (s, z) pairs at p, of dtype DT; zeros beyond count,
 * nothing read there. */
QK_INLINE void load_params16(const char* p, size_t count, qk_dtype DT, __m512* s, __m512* zp) {
  const size_t values = 2 * count; /* s0 z0 s1 z1 ... */
  QK_ASAN_CHECK(p, values * (DT == QK_F32 ? 4 : 2), 0);
  __m512 a, b; /* pairs 0..7, pairs 8..15 */
  if (DT == QK_F32) {
    a = _mm512_maskz_loadu_ps(qk512_mask(values), p);
    b = _mm512_maskz_loadu_ps(qk512_mask(values > 16 ? values - 16 : 0), p + 64);
  } else {
    const __mmask32 mask = values >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << values) - 1);
    const __m512i h = _mm512_maskz_loadu_epi16(mask, p);
    const __m256i h0 = _mm512_castsi512_si256(h), h1 = _mm512_extracti64x4_epi64(h, 1);
    if (DT == QK_F16) {
      a = _mm512_cvtph_ps(h0);
      b = _mm512_cvtph_ps(h1);
    } else {
      a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
      b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
    }
  }
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  *s = _mm512_permutex2var_ps(a, even, b);
  const __m512 z = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
  *zp = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), *s, z);
}

/* One k of GS groups: per group s, the 16-byte rows at wk + s *
 * group_size * 16 + p * panel_bytes (p < P) widened and multiplied into
 * the partial sums ps[.][2P s ..] of MR rows. */
QK_INLINE void qb4w_step(const size_t MR, const size_t P, const size_t GS, const uint8_t* wk,
                         size_t panel_bytes, size_t group_size, const float* const* ar, size_t k,
                         __m512i low, __m512 ps[8][8]) {
#pragma GCC unroll 4
  for (size_t s = 0; s < GS; s++)
#pragma GCC unroll 4
    for (size_t p = 0; p < P; p++) {
      const uint8_t* row = wk + s * group_size * 16 + p * panel_bytes;
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)row));
      const __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(b, low));
      const __m512 q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
#pragma GCC unroll 8
      for (size_t i = 0; i < MR; i++) {
        const __m512 xv = _mm512_set1_ps(ar[i][k + s * group_size]);
        ps[i][2 * P * s + 2 * p] = _mm512_fmadd_ps(xv, q0, ps[i][2 * P * s + 2 * p]);
        ps[i][2 * P * s + 2 * p + 1] = _mm512_fmadd_ps(xv, q1, ps[i][2 * P * s + 2 * p + 1]);
      }
    }
}

/* Groups g .. g + GS - 1 of P consecutive panels from panel p0 (w0 at its
 * first k-row) for MR rows, the products of the groups side by side, each
 * applied to acc in turn (see the top). */
QK_INLINE void qb4w_groups(const size_t MR, const size_t P, const size_t GS, const qk_dtype DT,
                           size_t g, size_t p0, size_t nc, size_t kc, size_t group_size,
                           const float* const* ar, const uint8_t* w0, const char* sz,
                           size_t sz_stride, __m512i low, __m512 acc[8][8]) {
  const size_t pair = DT == QK_F32 ? 8 : 4, panel_bytes = kc * 16;
  if ((g + GS) * group_size < kc) /* the next groups' scales and zeros, fetched now */
    for (size_t s = 0; s < GS; s++)
      for (size_t p = 0; p < P; p++)
        for (size_t l = 0; l < pair * 32; l += 64)
          _mm_prefetch(sz + (g + GS + s) * sz_stride + (32 * (p0 + p)) * pair + l, _MM_HINT_T0);
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
      qb4w_step(MR, P, GS, wk + u * 16, panel_bytes, group_size, ar, k + u, low, ps);
  }
  for (size_t s = 0; s < GS; s++) {
    const char* row = sz + (g + s) * sz_stride;
    for (size_t v = 0; v < 2 * P; v++) {
      const size_t col = 32 * (p0 + v / 2) + 16 * (v % 2);
      if (col >= nc) break;
      __m512 sc, zp;
      load_params16(row + col * pair, nc - col < 16 ? nc - col : 16, DT, &sc, &zp);
#pragma GCC unroll 8
      for (size_t i = 0; i < MR; i++) {
        acc[i][v] = _mm512_fmadd_ps(ps[i][2 * P * s + v], sc, acc[i][v]);
        acc[i][v] = _mm512_fmadd_ps(_mm512_set1_ps(ar[i][kc + g + s]), zp, acc[i][v]);
      }
    }
  }
}

/* P consecutive panels from panel p0 for MR rows (see the top). */
QK_INLINE void qb4w_panels(const size_t MR, const size_t P, const qk_dtype DT, size_t p0, size_t nc,
                           size_t kc, size_t group_size, const float* const* ar, char* const* cr,
                           const uint8_t* w, const char* sz, size_t sz_stride, const float* bias) {
  const size_t groups = kc / group_size;
  const __m512i low = _mm512_set1_epi32(15);
  const uint8_t* w0 = w + p0 * kc * 16;
  __m512 acc[8][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * P; v++) acc[i][v] = _mm512_setzero_ps();
  /* groups side by side until eight FMA chains (2 MR P GS) run */
  const size_t GS = 2 * MR * P >= 8 ? 1 : MR == 1 ? 4 / P : 2;
  size_t g = 0;
  for (; g + GS <= groups; g += GS)
    qb4w_groups(MR, P, GS, DT, g, p0, nc, kc, group_size, ar, w0, sz, sz_stride, low, acc);
  for (; g < groups; g++)
    qb4w_groups(MR, P, 1, DT, g, p0, nc, kc, group_size, ar, w0, sz, sz_stride, low, acc);
  for (size_t v = 0; v < 2 * P; v++) {
    const size_t col = 32 * (p0 + v / 2) + 16 * (v % 2);
    if (col >= nc) break;
    const __mmask16 mask = qk512_mask(nc - col);
    const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; i++)
      qk512_store(cr[i], col, DT, bias ? _mm512_add_ps(acc[i][v], b) : acc[i][v], mask);
  }
}

/* mr = MR rows over all nc columns, P panels at a time, then fewer. */
QK_INLINE void qb4w_rows(const size_t MR, const qk_dtype DT, size_t nc, size_t kc,
                         size_t group_size, const float* const* a, const uint8_t* w, const void* sz,
                         size_t sz_stride, const float* bias, void* c, ptrdiff_t c_stride) {
  char* cr[8];
  for (size_t i = 0; i < MR; i++) cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
  const size_t P = MR == 1 ? 4 : MR <= 3 ? 2 : 1, panels = (nc + 31) / 32;
  size_t p = 0;
  for (; p + P <= panels; p += P)
    qb4w_panels(MR, P, DT, p, nc, kc, group_size, a, cr, w, sz, sz_stride, bias);
  if (P == 4 && p + 2 <= panels) {
    qb4w_panels(MR, 2, DT, p, nc, kc, group_size, a, cr, w, sz, sz_stride, bias);
    p += 2;
  }
  if (p < panels) qb4w_panels(MR, 1, DT, p, nc, kc, group_size, a, cr, w, sz, sz_stride, bias);
}

QK_DEFINE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512, qb4w_rows, 8)
