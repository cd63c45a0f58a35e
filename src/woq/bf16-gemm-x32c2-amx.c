/*
 * bf16-gemm-x32c2-amx.c -- WoQ GEMM micro-kernels 32x32c2 (packed int8
 * weights, widened here) and bf16w 32x32c2 (weights already widened by the
 * driver), AMX-TILE + AMX-BF16 (tdpbf16ps); AVX-512 F/BW build the A and B
 * tiles and run the epilogue.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), layout nr = 32, kr = 2
 * (packed, or widened for bf16w), mr <= 32.  bf16 x is read as is; f16 and
 * f32 x come split by the driver into 2 or 3 bf16 planes whose sum is x
 * exactly (qk_woq_split_x__avx512), each plane one more tdpbf16ps per tile.
 *
 * For each 32-column panel, K is walked in chunks of 32 (16 k-groups):
 *
 *   C  tmm0..tmm3  rows 0..15 / 16..31 x columns 0..15 / 16..31, f32
 *   A  tmm4, tmm5  rows 0..15 / 16..31 x 32 bf16: x[i, k0 .. k0+31], loaded
 *                  straight from x when the rows are equally spaced and the
 *                  chunk ends within kc, else copied into an aligned buffer
 *                  with zeros beyond kc (x is never read past kc)
 *   B  tmm6, tmm7  16 k-groups x 16 columns x (k, k+1) bf16: a k-group's
 *                  64 int8, widened to bf16 (exact: |w| <= 128), are one row
 *                  of each, built in a buffer (rows past the last k-group
 *                  zero) -- or, for bf16w, loaded straight from the widened
 *                  panel, whose zero padding covers the last chunk; each B
 *                  tile serves both row halves
 *
 * tdpbf16ps accumulates in f32, like vdpbf16ps treating bf16 subnormal inputs
 * as zero and flushing subnormal results (DAZ/FTZ), in its own summation
 * order.  Epilogue: scale (multiply), bias (add), one rounding to bf16 (exact
 * RNE, subnormals kept); only rows < mr and columns < nc are written.  The
 * tile configuration is loaded on entry and released on return.
 */
#include <string.h>

#include "io-avx512.h"
#include "ukernel-define.h"

/* C tiles: rows 0..15 / 16..31 x columns 0..15 / 16..31 of the panel. */
#define TILE_C00 0
#define TILE_C01 1
#define TILE_C10 2
#define TILE_C11 3
#define TILE_A0 4 /* rows 0..15 */
#define TILE_A1 5 /* rows 16..31 */
#define TILE_B0 6 /* columns 0..15 */
#define TILE_B1 7 /* columns 16..31 */

/* GCC's AMX intrinsics do not declare the memory that ldtilecfg and
 * tileloadd read or tilestored writes, so a compiler barrier orders the
 * plain loads and stores around them. */
#define QK_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

/* Palette-1 tile configuration (64 bytes, Intel SDM LDTILECFG). */
typedef struct qk_tilecfg {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} qk_tilecfg;
_Static_assert(sizeof(qk_tilecfg) == 64, "LDTILECFG reads 64 bytes");

/* A and C tiles of the first half hold min(mr, 16) rows, of the second
 * mr - 16 (1 when unused); every tile row is 64 bytes. */
QK_INLINE void load_tile_config(size_t mr) {
  qk_tilecfg cfg __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  const uint8_t rows0 = (uint8_t)(mr < 16 ? mr : 16);
  const uint8_t rows1 = (uint8_t)(mr > 16 ? mr - 16 : 1);
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64;
  cfg.rows[TILE_C00] = cfg.rows[TILE_C01] = cfg.rows[TILE_A0] = rows0;
  cfg.rows[TILE_C10] = cfg.rows[TILE_C11] = cfg.rows[TILE_A1] = rows1;
  cfg.rows[TILE_B0] = cfg.rows[TILE_B1] = 16;
  QK_MEMORY_BARRIER();
  _tile_loadconfig(&cfg);
}

/* x[i, k0 .. k0+31] of rows i < mr, zero beyond kc (masked-off lanes are not
 * read, so no access goes past the row). */
QK_INLINE void copy_a(size_t mr, const void* const* a, size_t k0, size_t kc,
                      uint16_t abuf[32][32]) {
  const size_t n = kc - k0;
  const __mmask32 mask = n >= 32 ? (__mmask32)~0u : (__mmask32)((1u << n) - 1u);
  for (size_t i = 0; i < mr; i++) {
    QK_ASAN_CHECK((const uint16_t*)a[i] + k0, 2 * (n >= 32 ? 32 : n), 0);
    _mm512_store_si512(abuf[i], _mm512_maskz_loadu_epi16(mask, (const uint16_t*)a[i] + k0));
  }
}

/* `groups` (<= 16) k-groups of 64 int8 -> rows of the two B tiles. */
QK_INLINE void widen_b(const int8_t* wp, size_t groups, uint16_t bbuf[2][16][32]) {
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  size_t g = 0;
  for (; g < groups; g++, wp += 64) {
    _mm_prefetch((const char*)wp + QK_PREFETCH_BYTES, _MM_HINT_T0);
    _mm512_store_si512(bbuf[0][g], qk512_i8_to_bf16(wp, idx));
    _mm512_store_si512(bbuf[1][g], qk512_i8_to_bf16(wp + 32, idx));
  }
  for (; g < 16; g++) {
    _mm512_store_si512(bbuf[0][g], _mm512_setzero_si512());
    _mm512_store_si512(bbuf[1][g], _mm512_setzero_si512());
  }
}

/* PREWIDENED: w holds widened panels (include/qkern/woq.h), read straight
 * into the B tiles; else packed int8 panels, widened here chunk by chunk.
 * Rows 16..31 (when mr > 16) reuse each B tile loaded for rows 0..15. */
QK_INLINE void amx_body(const int PREWIDENED, const qk_dtype DT, size_t mr, size_t nc,
                        size_t kc, const void* const* a, const int8_t* w, const float* scale,
                        const float* bias, void* c, ptrdiff_t c_stride) {
  /* f16/f32 x arrives split into bf16 planes (the driver's split function):
   * plane p of row i at a[i] + p * plane_bytes, zero-padded to a multiple of
   * 32 k, rows equally spaced. */
  const size_t planes = DT == QK_F32 ? 3 : DT == QK_F16 ? 2 : 1;
  const size_t plane_bytes = (kc + 31) / 32 * 32 * 2;
  uint16_t abuf[32][32] __attribute__((aligned(64)));
  uint16_t bbuf[2][16][32] __attribute__((aligned(64)));
  float cbuf[32][32] __attribute__((aligned(64)));
  const int two = mr > 16;
  const size_t groups = (kc + 1) / 2;
  const size_t panel_bytes = PREWIDENED ? (groups + 15) / 16 * 16 * 128 : groups * 64;
  /* Rows equally spaced (as they are when x is one strided array): full
   * chunks of A are loaded straight from x. */
  const char* a0 = (const char*)a[0];
  const ptrdiff_t a_stride = mr > 1 ? (ptrdiff_t)((uintptr_t)a[1] - (uintptr_t)a0) : 0;
  int a_direct = 1;
  for (size_t i = 2; i < mr; i++)
    a_direct &= (ptrdiff_t)((uintptr_t)a[i] - (uintptr_t)a[i - 1]) == a_stride;

  load_tile_config(mr);
  for (size_t n0 = 0; n0 < nc; n0 += 32, w += panel_bytes) {
    _tile_zero(TILE_C00);
    _tile_zero(TILE_C01);
    if (two) {
      _tile_zero(TILE_C10);
      _tile_zero(TILE_C11);
    }
    for (size_t g0 = 0; g0 < groups; g0 += 16) {
      const size_t k0 = 2 * g0;
      const int direct = planes > 1 || (a_direct && k0 + 32 <= kc);
      if (!direct) copy_a(mr, a, k0, kc, abuf);
      if (!PREWIDENED) widen_b(w + 64 * g0, groups - g0 < 16 ? groups - g0 : 16, bbuf);
      QK_MEMORY_BARRIER();
      if (PREWIDENED) {
        QK_ASAN_CHECK(w + 128 * g0, 16 * 128, 0);
        _tile_loadd(TILE_B0, w + 128 * g0, 128);
        _tile_loadd(TILE_B1, w + 128 * g0 + 64, 128);
      } else {
        _tile_loadd(TILE_B0, bbuf[0], 64);
        _tile_loadd(TILE_B1, bbuf[1], 64);
      }
      for (size_t p = 0; p < planes; p++) {
        const char* ap = a0 + p * plane_bytes + 2 * k0;
        if (direct) {
          for (size_t i = 0; i < mr; i++) QK_ASAN_CHECK(ap + (ptrdiff_t)i * a_stride, 64, 0);
          _tile_loadd(TILE_A0, ap, a_stride);
        } else
          _tile_loadd(TILE_A0, abuf[0], 64);
        _tile_dpbf16ps(TILE_C00, TILE_A0, TILE_B0);
        _tile_dpbf16ps(TILE_C01, TILE_A0, TILE_B1);
        if (two) {
          if (direct)
            _tile_loadd(TILE_A1, ap + 16 * a_stride, a_stride);
          else
            _tile_loadd(TILE_A1, abuf[16], 64);
          _tile_dpbf16ps(TILE_C10, TILE_A1, TILE_B0);
          _tile_dpbf16ps(TILE_C11, TILE_A1, TILE_B1);
        }
      }
    }
    _tile_stored(TILE_C00, &cbuf[0][0], 128);
    _tile_stored(TILE_C01, &cbuf[0][16], 128);
    if (two) {
      _tile_stored(TILE_C10, &cbuf[16][0], 128);
      _tile_stored(TILE_C11, &cbuf[16][16], 128);
    }
    QK_MEMORY_BARRIER();

    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_loadu_ps(scale + col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < mr; i++) {
        qk512_epilogue((char*)c + (ptrdiff_t)i * c_stride, col, DT,
                       _mm512_load_ps(&cbuf[i][16 * h]), s, b, bias != NULL, mask);
      }
    }
  }
  _tile_release();
}

/* The two kernels differ only in where B comes from (MR is always 32). */
#define AMX_PACKED(MR, DT, ...) amx_body(0, DT, __VA_ARGS__)
#define AMX_WIDENED(MR, DT, ...) amx_body(1, DT, __VA_ARGS__)

QK_DEFINE_UKERNEL_ALL_DTYPES(qk_woq_bf16_gemm_ukernel_32x32c2__amx, AMX_PACKED, 32)
QK_DEFINE_UKERNEL_ALL_DTYPES(qk_woq_bf16w_gemm_ukernel_32x32c2__amx, AMX_WIDENED, 32)
