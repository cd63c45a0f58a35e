/*
 * woq_pack.c -- packs an N x K int8 weight into the panel layout (nr, kr)
 * drawn in include/qkern/woq.h.  Portable C, baseline flags; where the
 * baseline has SSE2 (every x86-64), the whole k-blocks of the SIMD
 * kernels' layouts (16, 1) and (32, 2) are packed by register transposes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qkern/woq.h"

#ifdef __SSE2__
#include <emmintrin.h>

/* Inlined with S a constant, so the transposes unroll into registers. */
#define PACK_INLINE static inline __attribute__((always_inline))

/* Transposes the 2^S x 2^S matrix whose row r is v[r], of elements 16 / 2^S
 * bytes wide (S = 4: 16 x 16 bytes; S = 3: 8 x 8 pairs of bytes).  Each
 * stage interleaves neighbouring vectors at twice the last stage's width;
 * afterwards v[i] holds column bit_reverse(S, i). */
PACK_INLINE void transpose_rows(const int S, __m128i* v) {
  const int n = 1 << S;
  __m128i t[16];
#pragma GCC unroll 4
  for (int stage = 4 - S; stage < 4; stage++) {
    __m128i* src = (stage - (4 - S)) % 2 ? t : v;
    __m128i* dst = src == v ? t : v;
#pragma GCC unroll 8
    for (int i = 0; i < n / 2; i++) {
      const __m128i a = src[2 * i], b = src[2 * i + 1];
      switch (stage) {
        case 0: dst[i] = _mm_unpacklo_epi8(a, b), dst[i + n / 2] = _mm_unpackhi_epi8(a, b); break;
        case 1: dst[i] = _mm_unpacklo_epi16(a, b), dst[i + n / 2] = _mm_unpackhi_epi16(a, b); break;
        case 2: dst[i] = _mm_unpacklo_epi32(a, b), dst[i + n / 2] = _mm_unpackhi_epi32(a, b); break;
        default: dst[i] = _mm_unpacklo_epi64(a, b), dst[i + n / 2] = _mm_unpackhi_epi64(a, b);
      }
    }
  }
  if (S % 2) /* an odd number of stages left the result in t */
#pragma GCC unroll 16
    for (int i = 0; i < n; i++) v[i] = t[i];
}

PACK_INLINE int bit_reverse(const int S, const int i) {
  int r = 0;
  for (int b = 0; b < S; b++) r |= ((i >> b) & 1) << (S - 1 - b);
  return r;
}

/* Packs the k-groups [0, groups) of one whole panel of rows w (ldw bytes
 * apart) into group (the panel's first k-group), for (nr, kr) = (16, 1)
 * with S = 4 (16 rows of 16 bytes) or (32, 2) with S = 3 (8 rows of 8
 * pairs), in blocks of 16 bytes per row; returns the k-groups done (a
 * multiple of 16 / kr). */
PACK_INLINE size_t pack_panel_transposed(const int S, const int8_t* w, size_t ldw, size_t groups,
                                         uint32_t nr, int8_t* group) {
  const size_t kr = S == 4 ? 1 : 2;
  const size_t per_block = 16 / kr; /* k-groups per 16 bytes of a row */
  size_t g0 = 0;
  for (; g0 + per_block <= groups; g0 += per_block)
    for (size_t j0 = 0; j0 < nr; j0 += (size_t)1 << S) {
      __m128i v[16];
#pragma GCC unroll 16
      for (int r = 0; r < 1 << S; r++)
        v[r] = _mm_loadu_si128((const __m128i*)(w + (j0 + r) * ldw + g0 * kr));
      transpose_rows(S, v);
#pragma GCC unroll 16
      for (int i = 0; i < 1 << S; i++)
        _mm_storeu_si128((__m128i*)(group + (g0 + bit_reverse(S, i)) * nr * kr + j0 * kr), v[i]);
    }
  return g0;
}

static size_t pack_panel_sse2(const int8_t* w, size_t ldw, size_t groups, uint32_t nr, size_t kr,
                              int8_t* group) {
  return kr == 1 ? pack_panel_transposed(4, w, ldw, groups, nr, group)
                 : pack_panel_transposed(3, w, ldw, groups, nr, group);
}
#endif

static size_t round_up(size_t v, size_t q) { return (v + q - 1) / q * q; }

size_t qk_woq_group_len(size_t k, uint32_t kr) { return kr ? kr : (k ? k : 1); }

size_t qk_woq_packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr) {
  size_t whole, rows, total;
  const size_t kp = round_up(k, qk_woq_group_len(k, kr));
  if (kp < k || __builtin_mul_overflow(n / nr * nr, kp, &whole) ||
      __builtin_mul_overflow(n % nr, k, &rows) || __builtin_add_overflow(whole, rows, &total))
    return SIZE_MAX;
  return total;
}

/* Copies kr bytes; kr is 1 or 2 for every kernel, so those are inlined. */
static inline void copy_run(int8_t* dst, const int8_t* src, size_t kr) {
  if (kr == 1)
    dst[0] = src[0];
  else if (kr == 2)
    memcpy(dst, src, 2);
  else
    memcpy(dst, src, kr);
}

/* Moves n rows of w (rows ldw bytes apart) into roundup(n, nr) / nr whole
 * panels, padded with zeros (to_panels), or the panels' values back into
 * the rows (w is written only then). */
static void move_panels(int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr, uint32_t kr_tag,
                        int8_t* panels, int to_panels) {
  const size_t kr = qk_woq_group_len(k, kr_tag);
  const size_t kp = round_up(k, kr), full_groups = k / kr, tail = k % kr;
  /* Panel by panel, through the panels sequentially; the nr rows are nr
   * sequential streams.  Only a panel with padding (columns past n, or
   * bytes past k in its last k-group) is zeroed first. */
  for (size_t p0 = 0; p0 < n; p0 += nr) {
    const size_t cols = n - p0 < nr ? n - p0 : nr;
    int8_t* group = panels + p0 * kp;
    size_t g = 0;
    if (to_panels && (cols < nr || tail)) memset(group, 0, nr * kp);
#ifdef __SSE2__
    if (to_panels && cols == nr && ((nr == 16 && kr == 1) || (nr == 32 && kr == 2))) {
      g = pack_panel_sse2(w + p0 * ldw, ldw, full_groups, nr, kr, group);
      group += g * nr * kr;
    }
#endif
    for (; g < full_groups + (tail != 0); g++, group += nr * kr) {
      const size_t run = g < full_groups ? kr : tail;
      for (size_t j = 0; j < cols; j++) {
        int8_t* row = w + (p0 + j) * ldw + g * kr;
        if (to_panels)
          copy_run(group + j * kr, row, run);
        else
          copy_run(row, group + j * kr, run);
      }
    }
  }
}

void qk_woq_pack(const int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr, uint32_t kr,
                 int8_t* out) {
  const size_t whole = n / nr * nr;
  move_panels((int8_t*)w, ldw, whole, k, nr, kr, out, 1);
  int8_t* rows = out + qk_woq_packed_size(whole, k, nr, kr);
  for (size_t j = whole; j < n; j++) memcpy(rows + (j - whole) * k, w + j * ldw, k);
}

void qk_woq_unpack(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr, int8_t* w,
                   size_t ldw) {
  const size_t whole = n / nr * nr;
  move_panels(w, ldw, whole, k, nr, kr, (int8_t*)packed, 0);
  const int8_t* rows = packed + qk_woq_packed_size(whole, k, nr, kr);
  for (size_t j = whole; j < n; j++) memcpy(w + j * ldw, rows + (j - whole) * k, k);
}

void qk_woq_pad_last_panel(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr,
                           int8_t* out) {
  const size_t whole = n / nr * nr;
  move_panels((int8_t*)packed + qk_woq_packed_size(whole, k, nr, kr), k, n - whole, k, nr, kr, out,
              1);
}

size_t qk_woq_widened_size(const qk_woq_kernel* kern, size_t n, size_t k) {
  if (!kern->widen || kern->kind != QK_WOQ_PANELS || kern->nr == 0 || kern->kr == 0) return 0;
  const size_t panels = n / kern->nr + (n % kern->nr != 0);
  size_t bytes = qk_woq_widened_panel_size(kern, k);
  if (bytes == SIZE_MAX || __builtin_mul_overflow(bytes, panels, &bytes)) return SIZE_MAX;
  return bytes;
}

int qk_woq_widen_weight(const qk_woq_kernel* kern, const int8_t* packed, size_t n, size_t k,
                        void* out) {
  if (!kern->widen || kern->kind != QK_WOQ_PANELS || kern->nr == 0 ||
      qk_woq_widened_size(kern, n, k) == SIZE_MAX)
    return QK_ERR_ARG;
  const size_t whole = n / kern->nr, wide_panel = qk_woq_widened_panel_size(kern, k);
  if (whole) kern->widen(packed, whole, k, out);
  if (n % kern->nr) {
    const size_t panel = qk_woq_packed_size(kern->nr, k, kern->nr, kern->kr);
    int8_t* last = aligned_alloc(64, (panel + 64) / 64 * 64);
    if (!last) return QK_ERR_NOMEM;
    qk_woq_pad_last_panel(packed, n, k, kern->nr, kern->kr, last);
    kern->widen(last, 1, k, (char*)out + whole * wide_panel);
    free(last);
  }
  return QK_OK;
}

size_t qk_woq_int4_packed_size(size_t n, size_t k) {
  size_t bytes;
  if (__builtin_mul_overflow((n + 31) / 32, k, &bytes) || __builtin_mul_overflow(bytes, 16, &bytes))
    return SIZE_MAX;
  return bytes;
}

void qk_woq_int4_pack(const uint8_t* q, size_t ldq, size_t n, size_t k, uint8_t* out) {
  memset(out, 0, qk_woq_int4_packed_size(n, k));
  for (size_t col = 0; col < n; col++) {
    /* column col: panel col / 32, byte col % 16 of each k-row, high nibble
     * for the panel's columns 16..31 */
    uint8_t* dst = out + col / 32 * k * 16 + col % 16;
    const int shift = col % 32 >= 16 ? 4 : 0;
    const uint8_t* row = q + col * ldq;
    for (size_t kk = 0; kk < k; kk++) dst[kk * 16] |= (uint8_t)((row[kk] & 15u) << shift);
  }
}

void qk_woq_int4_unpack(const uint8_t* packed, size_t n, size_t k, uint8_t* q, size_t ldq) {
  for (size_t col = 0; col < n; col++) {
    const uint8_t* src = packed + col / 32 * k * 16 + col % 16;
    const int shift = col % 32 >= 16 ? 4 : 0;
    uint8_t* row = q + col * ldq;
    for (size_t kk = 0; kk < k; kk++) row[kk] = (uint8_t)((src[kk * 16] >> shift) & 15u);
  }
}
