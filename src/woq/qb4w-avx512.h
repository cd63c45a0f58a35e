/*
 * qb4w-avx512.h -- AVX-512 (F/BW/VL, F16C) helpers shared by the int4
 * groupwise kernels: the scales and zeros of 16 columns, the group
 * epilogue and the final stores, on blocks of P panels (vectors v = 2p + h:
 * columns 32 (p0 + p) + 16 h ..) and MR rows.  Include only from files
 * compiled with the AVX-512 flags.
 */
#ifndef QKERN_QB4W_AVX512_H
#define QKERN_QB4W_AVX512_H

#include "io-avx512.h"

/* The scales s and z' = fma(-8, s, z) of the first `count` (0..16) of 16
 * columns, from their (s, z) pairs at p, of dtype DT; zeros beyond count,
 * nothing read there (count 0: all zeros, nothing read). */
QK_INLINE void qk512_qb4w_params16(const char* p, size_t count, qk_dtype DT, __m512* s,
                                   __m512* zp) {
  const size_t values = 2 * count; /* s0 z0 s1 z1 ... */
  QK_ASAN_CHECK(p, values * qk_dtype_size(DT), 0);
  __m512 a, b; /* pairs 0..7, pairs 8..15 */
  if (DT == QK_F32) {
    a = _mm512_maskz_loadu_ps(qk512_mask(values), p);
    b = _mm512_maskz_loadu_ps(qk512_mask(values > 16 ? values - 16 : 0), p + 64);
  } else {
    const __mmask32 mask = qk512_mask32(values);
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

/* The floats 0..15: q -> f32(q) for vpermps, which reads the low 4 bits
 * of each index lane. */
static const float qk512_qb4w_f32_of_q[16]
    __attribute__((aligned(64))) = {0.0f, 1.0f, 2.0f,  3.0f,  4.0f,  5.0f,  6.0f,  7.0f,
                                    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f};

/* The 16-byte packed int4 row at row -> f32 vectors *q0, its low nibbles
 * (columns 0..15), and *q1, its high nibbles (columns 16..31) or, if
 * WHOLE_BYTES, its whole bytes (16 high + low, from whose sums the
 * f32_qb4w kernels take the low nibbles'): a zero-extension to dwords,
 * then a lookup in table (qk512_qb4w_f32_of_q, loaded) for the low nibbles
 * (no AND, no conversion) and a conversion of the bytes, shifted down by 4
 * unless WHOLE_BYTES (a second lookup ran slower on a Zen 4: the two kinds
 * of instruction share out the vector ports). */
QK_INLINE void qk512_qb4w_widen_f32(const int WHOLE_BYTES, const uint8_t* row, __m512 table,
                                    __m512* q0, __m512* q1) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)row));
  *q0 = _mm512_permutexvar_ps(b, table);
  *q1 = _mm512_cvtepi32_ps(WHOLE_BYTES ? b : _mm512_srli_epi32(b, 4));
}

/* bf16(i & 15) for i = 0..31 (exact): vpermw reads the low 5 bits of an
 * index, so a byte widened to a word looks its low nibble up here with no
 * AND. */
static const uint16_t qk512_qb4w_bf16_of_q[32] __attribute__((aligned(64))) = {
    0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120,
    0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0,
    0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};

/* Word indices pairing 16 bytes of row k (words 0..15) with those of row
 * k + 1 (words 16..31), column by column. */
static const uint16_t qk512_qb4w_pair_rows[32]
    __attribute__((aligned(64))) = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* 32 words b, each a byte of packed int4 (its high byte 0), paired (q[k],
 * q[k+1]) column by column -> the bf16 pairs of columns 0..15 (*q0: the
 * low nibbles) and 16..31 (*q1: b shifted right by 4), the operand order
 * of vdpbf16ps and of an AMX B tile row: a lookup of q -> bf16(q) (exact)
 * in table, qk512_qb4w_bf16_of_q loaded. */
QK_INLINE void qk512_qb4w_bf16_pairs(__m512i b, __m512i table, __m512i* q0, __m512i* q1) {
  *q0 = _mm512_permutexvar_epi16(b, table);
  *q1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), table);
}

/* The 32 bytes of packed int4 rows k and k + 1 at row -> their bf16 pairs
 * (qk512_qb4w_bf16_pairs) after a zero-extension to words and one word
 * permutation pairing the rows column by column (pairs:
 * qk512_qb4w_pair_rows, loaded; the AVX-512-BF16 kernel pairs them with
 * one vpermb instead, the same bits). */
QK_INLINE void qk512_qb4w_widen_pair(const uint8_t* row, __m512i pairs, __m512i table, __m512i* q0,
                                     __m512i* q1) {
  qk512_qb4w_bf16_pairs(_mm512_permutexvar_epi16(
                            pairs, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)row))),
                        table, q0, q1);
}

/* `pairs_count` pairs of packed int4 k-rows from rows (32 bytes a pair)
 * -> the rows of the AMX B tiles, 128 bytes a pair at dst: the (q[k],
 * q[k+1]) bf16 pairs of columns 0..15, then of columns 16..31 (the widened
 * layout of include/qkern/woq.h). */
QK_INLINE void qk512_qb4w_widen_rows(const uint8_t* rows, size_t pairs_count, char* dst) {
  const __m512i pairs = _mm512_load_si512(qk512_qb4w_pair_rows);
  const __m512i table = _mm512_load_si512(qk512_qb4w_bf16_of_q);
  for (size_t j = 0; j < pairs_count; j++, rows += 32, dst += 128) {
    if (j % 2 == 0) _mm_prefetch((const char*)rows + QK_PREFETCH_BYTES, _MM_HINT_T0);
    __m512i q0, q1;
    qk512_qb4w_widen_pair(rows, pairs, table, &q0, &q1);
    _mm512_storeu_si512(dst, q0);
    _mm512_storeu_si512(dst + 64, q1);
  }
}

/* Prefetches the scales and zeros of groups g .. g + GS - 1 of P panels
 * from panel p0. */
QK_INLINE void qk512_qb4w_prefetch_params(const size_t P, const size_t GS, const qk_dtype DT,
                                          size_t g, size_t p0, const char* sz, size_t sz_stride) {
  const size_t pair = 2 * qk_dtype_size(DT);
  for (size_t s = 0; s < GS; s++)
    for (size_t p = 0; p < P; p++)
      for (size_t l = 0; l < pair * 32; l += 64)
        _mm_prefetch(sz + (g + s) * sz_stride + (32 * (p0 + p)) * pair + l, _MM_HINT_T0);
}

/* The group epilogue of groups g .. g + GS - 1 (partial sums ps[i][2 P s +
 * v] of group g + s), in group order: acc = fma(p, s, acc) then acc =
 * fma(xs, z', acc), xs the row's group sum at ar[i][kc + g + s]. */
QK_INLINE void qk512_qb4w_apply_groups(const size_t MR, const size_t P, const size_t GS,
                                       const qk_dtype DT, size_t g, size_t p0, size_t nc, size_t kc,
                                       const float* const* ar, const char* sz, size_t sz_stride,
                                       __m512 ps[8][8], __m512 acc[8][8]) {
  const size_t pair = 2 * qk_dtype_size(DT);
  for (size_t s = 0; s < GS; s++) {
    const char* row = sz + (g + s) * sz_stride;
    for (size_t v = 0; v < 2 * P; v++) {
      const size_t col = 32 * (p0 + v / 2) + 16 * (v % 2);
      if (col >= nc) break;
      __m512 sc, zp;
      qk512_qb4w_params16(row + col * pair, nc - col < 16 ? nc - col : 16, DT, &sc, &zp);
#pragma GCC unroll 8
      for (size_t i = 0; i < MR; i++) {
        acc[i][v] = _mm512_fmadd_ps(ps[i][2 * P * s + v], sc, acc[i][v]);
        acc[i][v] = _mm512_fmadd_ps(qk512_broadcast(&ar[i][kc + g + s]), zp, acc[i][v]);
      }
    }
  }
}

/* y = acc (+ bias) of MR rows and P panels from panel p0, one rounding to
 * DT, columns below nc only. */
QK_INLINE void qk512_qb4w_store(const size_t MR, const size_t P, const qk_dtype DT, size_t p0,
                                size_t nc, const float* bias, char* const* cr, __m512 acc[8][8]) {
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

#endif /* QKERN_QB4W_AVX512_H */
