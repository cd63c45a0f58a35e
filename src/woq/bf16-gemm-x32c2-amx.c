/*
 * bf16-gemm-x32c2-amx.c -- WoQ GEMM micro-kernel 16x32c2, AMX-TILE + AMX-BF16
 * (tdpbf16ps); AVX-512 F/BW build the A and B tiles and run the epilogue.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 32,
 * kr = 2, bf16 x only, mr <= 16.  For each 32-column panel, K is walked in
 * chunks of 32 (16 k-groups) with the tiles
 *
 *   C  tmm0, tmm1  mr rows x 16 f32: columns 0..15 and 16..31 of the panel
 *   A  tmm2        mr rows x 32 bf16: x[i, k0 .. k0+31], loaded straight
 *                  from x when the rows are equally spaced and the chunk ends
 *                  within kc, else copied into an aligned buffer with zeros
 *                  beyond kc (x is never read past kc)
 *   B  tmm3, tmm4  16 k-groups x 16 columns x (k, k+1) bf16: a k-group's
 *                  64 int8, widened to bf16 (exact: |w| <= 128), are one row
 *                  of each, built in a buffer; rows past the last k-group
 *                  are zero
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

#define TILE_C0 0
#define TILE_C1 1
#define TILE_A 2
#define TILE_B0 3
#define TILE_B1 4

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

QK_INLINE void load_tile_config(size_t mr) {
  qk_tilecfg cfg __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  cfg.colsb[TILE_C0] = cfg.colsb[TILE_C1] = cfg.colsb[TILE_A] = 64;
  cfg.colsb[TILE_B0] = cfg.colsb[TILE_B1] = 64;
  cfg.rows[TILE_C0] = cfg.rows[TILE_C1] = cfg.rows[TILE_A] = (uint8_t)mr;
  cfg.rows[TILE_B0] = cfg.rows[TILE_B1] = 16;
  QK_MEMORY_BARRIER();
  _tile_loadconfig(&cfg);
}

/* x[i, k0 .. k0+31] of rows i < mr, zero beyond kc (masked-off lanes are not
 * read, so no access goes past the row). */
QK_INLINE void copy_a(size_t mr, const void* const* a, size_t k0, size_t kc,
                      uint16_t abuf[16][32]) {
  const size_t n = kc - k0;
  const __mmask32 mask = n >= 32 ? (__mmask32)~0u : (__mmask32)((1u << n) - 1u);
  for (size_t i = 0; i < mr; i++) {
    QK_ASAN_CHECK((const uint16_t*)a[i] + k0, 2 * (n >= 32 ? 32 : n), 0);
    _mm512_store_si512(abuf[i], _mm512_maskz_loadu_epi16(mask, (const uint16_t*)a[i] + k0));
  }
}

/* Word indices of the high halves of the 32 f32 lanes of two vectors. */
static const uint16_t high_halves[32] __attribute__((aligned(64))) = {
    1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

/* 32 int8 -> 32 bf16: the high half of each f32, exact as |w| <= 128 has at
 * most 8 significant bits (one vpermt2w is cheaper than vcvtne2ps2bf16). */
QK_INLINE __m512i widen_32(const int8_t* p, __m512i idx) {
  return _mm512_permutex2var_epi16(_mm512_castps_si512(qk512_i8_to_f32(p)), idx,
                                   _mm512_castps_si512(qk512_i8_to_f32(p + 16)));
}

/* `groups` (<= 16) k-groups of 64 int8 -> rows of the two B tiles. */
QK_INLINE void widen_b(const int8_t* wp, size_t groups, uint16_t bbuf[2][16][32]) {
  const __m512i idx = _mm512_load_si512(high_halves);
  size_t g = 0;
  for (; g < groups; g++, wp += 64) {
    _mm512_store_si512(bbuf[0][g], widen_32(wp, idx));
    _mm512_store_si512(bbuf[1][g], widen_32(wp + 32, idx));
  }
  for (; g < 16; g++) {
    _mm512_store_si512(bbuf[0][g], _mm512_setzero_si512());
    _mm512_store_si512(bbuf[1][g], _mm512_setzero_si512());
  }
}

QK_INLINE void bf16_gemm_x32c2_amx(const size_t MR, const qk_dtype DT, size_t mr, size_t nc,
                                   size_t kc, const void* const* a, const int8_t* w,
                                   const float* scale, const float* bias, void* c,
                                   ptrdiff_t c_stride) {
  (void)MR;
  (void)DT;
  uint16_t abuf[16][32] __attribute__((aligned(64)));
  uint16_t bbuf[2][16][32] __attribute__((aligned(64)));
  float cbuf[16][32] __attribute__((aligned(64)));
  const size_t groups = (kc + 1) / 2;
  /* Rows equally spaced (as they are when x is one strided array): full
   * chunks of A are loaded straight from x. */
  const char* a0 = (const char*)a[0];
  const ptrdiff_t a_stride = mr > 1 ? (ptrdiff_t)((uintptr_t)a[1] - (uintptr_t)a0) : 0;
  int a_direct = 1;
  for (size_t i = 2; i < mr; i++)
    a_direct &= (ptrdiff_t)((uintptr_t)a[i] - (uintptr_t)a[i - 1]) == a_stride;

  load_tile_config(mr);
  for (size_t n0 = 0; n0 < nc; n0 += 32, w += groups * 64) {
    _tile_zero(TILE_C0);
    _tile_zero(TILE_C1);
    for (size_t g0 = 0; g0 < groups; g0 += 16) {
      const size_t k0 = 2 * g0;
      const int direct = a_direct && k0 + 32 <= kc;
      if (!direct) copy_a(mr, a, k0, kc, abuf);
      widen_b(w + 64 * g0, groups - g0 < 16 ? groups - g0 : 16, bbuf);
      QK_MEMORY_BARRIER();
      if (direct) {
        for (size_t i = 0; i < mr; i++) QK_ASAN_CHECK(a0 + 2 * k0 + (ptrdiff_t)i * a_stride, 64, 0);
        _tile_loadd(TILE_A, a0 + 2 * k0, a_stride);
      } else {
        _tile_loadd(TILE_A, abuf, 64);
      }
      _tile_loadd(TILE_B0, bbuf[0], 64);
      _tile_loadd(TILE_B1, bbuf[1], 64);
      _tile_dpbf16ps(TILE_C0, TILE_A, TILE_B0);
      _tile_dpbf16ps(TILE_C1, TILE_A, TILE_B1);
    }
    _tile_stored(TILE_C0, &cbuf[0][0], 128);
    _tile_stored(TILE_C1, &cbuf[0][16], 128);
    QK_MEMORY_BARRIER();

    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_loadu_ps(scale + col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < mr; i++) {
        __m512 v = _mm512_mul_ps(_mm512_load_ps(&cbuf[i][16 * h]), s);
        if (bias) v = _mm512_add_ps(v, b);
        qk512_store((char*)c + (ptrdiff_t)i * c_stride, col, QK_BF16, v, mask);
      }
    }
  }
  _tile_release();
}

QK_DEFINE_UKERNEL_BF16(qk_woq_bf16_gemm_ukernel_16x32c2__amx, bf16_gemm_x32c2_amx, 16)
