/*
 * qb4w-rows-avx512.h -- the loops over rows, panels and groups shared by
 * the AVX-512 int4 groupwise kernels.  Include it after defining
 *
 *   QK_INLINE void qb4w_groups(const size_t MR, const size_t P, const size_t GS,
 *                              const qk_dtype DT, size_t g, size_t p0, size_t nc, size_t kc,
 *                              size_t group_size, const float* const* ar, const uint8_t* w0,
 *                              const char* sz, size_t sz_stride, __m512 acc[8][8]);
 *
 * which adds groups g .. g + GS - 1 of the P panels from panel p0 (w0 at
 * its first k-row) into acc (qk512_qb4w_apply_groups, qb4w-avx512.h).
 * One row runs four panels at once and two to four rows two (and with
 * fewer panels in the call, as many groups side by side), so that at least
 * eight independent chains of partial sums (2 MR P GS) hide the latency of
 * the instruction that accumulates them; four rows on two panels took
 * 0.92-0.99 of the time on one (Zen 4), five or more lose.
 */
#ifndef QKERN_QB4W_ROWS_AVX512_H
#define QKERN_QB4W_ROWS_AVX512_H

/* P consecutive panels from panel p0 for MR rows. */
QK_INLINE void qb4w_panels(const size_t MR, const size_t P, const qk_dtype DT, size_t p0, size_t nc,
                           size_t kc, size_t group_size, const float* const* ar, char* const* cr,
                           const uint8_t* w, const char* sz, size_t sz_stride, const float* bias) {
  const size_t groups = kc / group_size;
  const uint8_t* w0 = w + p0 * kc * 16;
  __m512 acc[8][8];
  for (size_t i = 0; i < MR; i++)
    for (size_t v = 0; v < 2 * P; v++) acc[i][v] = _mm512_setzero_ps();
  const size_t GS = 2 * MR * P >= 8 ? 1 : MR == 1 ? 4 / P : 2;
  size_t g = 0;
  for (; g + GS <= groups; g += GS)
    qb4w_groups(MR, P, GS, DT, g, p0, nc, kc, group_size, ar, w0, sz, sz_stride, acc);
  for (; g < groups; g++)
    qb4w_groups(MR, P, 1, DT, g, p0, nc, kc, group_size, ar, w0, sz, sz_stride, acc);
  qk512_qb4w_store(MR, P, DT, p0, nc, bias, cr, acc);
}

/* mr = MR rows over all nc columns, P panels at a time, then fewer. */
QK_INLINE void qb4w_rows(const size_t MR, const qk_dtype DT, size_t nc, size_t kc,
                         size_t group_size, const float* const* a, const uint8_t* w, const void* sz,
                         size_t sz_stride, const float* bias, void* c, ptrdiff_t c_stride) {
  char* cr[8];
  for (size_t i = 0; i < MR; i++) cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
#define QB4W_PANELS(P, p) \
  qb4w_panels(MR, P, DT, p, nc, kc, group_size, a, cr, w, sz, sz_stride, bias)
  QK_X32_PANEL_STEPS(MR, 4, nc, QB4W_PANELS);
#undef QB4W_PANELS
}

#endif /* QKERN_QB4W_ROWS_AVX512_H */
