/*
 * pack-x-avx512.c -- packs one row of activations into the AMX tile
 * layouts of the bf16 (AMX) kernels (include/qkern/woq.h): "Packed x", A
 * tiles, and "Packed x^T", B tiles.  AVX-512 F/BW + F16C.
 *
 * bf16 x is copied as is (1 plane).  f32 (24 significant bits) -> 3 bf16
 * planes, f16 (11 bits) -> 2: plane 0 is x truncated to its top 16 bits
 * (bf16), plane 1 the top 16 bits of the exact remainder x - plane0, plane 2
 * the rest.  Each remainder is exact in f32 and the last fits bf16, so x ==
 * sum of the planes for finite x (a remainder below 2^-126 is lost by the
 * kernels' DAZ, within the bound of docs/semantics.rst).  Infinities and
 * NaNs stay whole in plane 0 (NaN kept quiet), later planes 0.
 *
 * For each chunk c of 32 k and each plane p, the row's 32 values (zero past
 * kc) go to group + c * chunk_stride + p * 2048 bytes: as 64 contiguous
 * bytes at row i's 64 * i (packed x), or as 16 pairs of k, 64 bytes apart,
 * at column t's 1024 * (t / 16) + 4 * (t % 16) (packed x^T: t = i; with
 * the planes stacked, t = i * P + p, at group + c * chunk_stride).  x is
 * not read past kc.
 */
#include <string.h>

#include "io-avx512.h"

/* 16 lanes: plane bits (x with its low 16 bits cleared, NaN kept quiet) and
 * the exact remainder (0 for non-finite x). */
QK_INLINE __m512i take_plane(__m512* x) {
  const __m512i bits = _mm512_castps_si512(*x);
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __mmask16 nonfinite = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exp_mask), exp_mask);
  const __mmask16 nan = nonfinite & _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff));
  __m512i top = _mm512_and_si512(bits, _mm512_set1_epi32((int)0xffff0000u));
  top = _mm512_mask_or_epi32(top, nan, top, _mm512_set1_epi32(0x00400000));
  *x = _mm512_maskz_sub_ps((__mmask16)~nonfinite, *x, _mm512_castsi512_ps(top));
  return top;
}

/* The row's planes for the chunk of 32 k from k (left = kc - k of them in
 * x): planes[p], 32 bf16 in k order. */
QK_INLINE void chunk_planes(const void* row, qk_dtype dt, size_t k, size_t left, size_t planes,
                            __m512i idx, __m512i out[3]) {
  QK_ASAN_CHECK((const char*)row + k * qk_dtype_size(dt),
                (left < 32 ? left : 32) * qk_dtype_size(dt), 0);
  if (dt == QK_BF16) {
    const __mmask32 m = qk512_mask32(left);
    out[0] = _mm512_maskz_loadu_epi16(m, (const uint16_t*)row + k);
    return;
  }
  const __mmask16 m0 = qk512_mask(left), m1 = qk512_mask(left > 16 ? left - 16 : 0);
  __m512 x0, x1;
  if (dt == QK_F32) {
    x0 = _mm512_maskz_loadu_ps(m0, (const float*)row + k);
    x1 = _mm512_maskz_loadu_ps(m1, (const float*)row + k + 16);
  } else {
    x0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, (const uint16_t*)row + k));
    x1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, (const uint16_t*)row + k + 16));
  }
  for (size_t p = 0; p < planes; p++) {
    const __m512i t0 = take_plane(&x0), t1 = take_plane(&x1);
    out[p] = _mm512_permutex2var_epi16(t0, idx, t1);
  }
}

/* Where pack_row puts a row: packed x, packed x^T, or packed x^T with
 * the planes stacked in the columns (include/qkern/woq.h). */
typedef enum packed_layout { PACKED_X, PACKED_XT, PACKED_XT_STACKED } packed_layout;

/* Packs row i of a group into LAYOUT. */
QK_INLINE void pack_row(const packed_layout LAYOUT, const void* row, qk_dtype dt, size_t kc,
                        size_t i, void* group, size_t chunk_stride) {
  const size_t planes = qk_bf16_planes(dt);
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  char* o = (char*)group;
  for (size_t k = 0; k < kc; k += 32, o += chunk_stride) {
    __m512i v[3] = {0}; /* chunk_planes writes the first `planes` (zeros: for -Wall) */
    chunk_planes(row, dt, k, kc - k, planes, idx, v);
    for (size_t p = 0; p < planes; p++) {
      if (LAYOUT == PACKED_X) {
        _mm512_storeu_si512(o + p * 2048 + 64 * i, v[p]);
        continue;
      }
      /* pair r of the chunk 64 bytes after pair r - 1, in column t */
      const size_t t = LAYOUT == PACKED_XT_STACKED ? i * planes + p : i;
      char* column =
          o + (LAYOUT == PACKED_XT_STACKED ? 0 : p * 2048) + 1024 * (t / 16) + 4 * (t % 16);
      uint32_t pairs[16];
      _mm512_storeu_si512(pairs, v[p]);
      for (size_t r = 0; r < 16; r++) memcpy(column + 64 * r, &pairs[r], 4);
    }
  }
}

void qk_woq_pack_x__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                           size_t chunk_stride) {
  pack_row(PACKED_X, row, dt, kc, i, group, chunk_stride);
}

void qk_woq_pack_xt__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                            size_t chunk_stride) {
  pack_row(PACKED_XT, row, dt, kc, i, group, chunk_stride);
}

void qk_woq_pack_xt_stacked__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                                    size_t chunk_stride) {
  pack_row(PACKED_XT_STACKED, row, dt, kc, i, group, chunk_stride);
}
