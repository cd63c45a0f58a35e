/*
 * bf16-gemm-x32c2-amx.c -- WoQ GEMM micro-kernels 32x32c2 (packed int8
 * weights, widened here) and bf16w 32x32c2 (weights already widened by the
 * driver), AMX-TILE + AMX-BF16 (tdpbf16ps); AVX-512 F/BW build the A and B
 * tiles and run the epilogue.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), layout nr = 32, kr = 2
 * (packed, or widened for bf16w), mr <= 32, x packed by the driver
 * (qk_woq_pack_x__avx512, "Packed x" in include/qkern/woq.h): a[0] is the
 * group of 32 rows, bf16 as is, f16 and f32 split into 2 or 3 bf16 planes
 * whose sum is x exactly, each plane one more tdpbf16ps per tile.
 *
 *   C  tmm0..tmm3  rows 0..15 / 16..31 x columns 0..15 / 16..31, f32
 *   A  tmm4, tmm5  rows 0..15 / 16..31 x 32 bf16 of one chunk of 32 k and
 *                  one plane: 1 KiB contiguous in packed x
 *   B  tmm6, tmm7  16 k-groups x 16 columns x (k, k+1) bf16: a k-group's
 *                  64 int8, widened to bf16 (exact: |w| <= 128), are one row
 *                  of each, built in a buffer (rows past the last k-group
 *                  zero) -- or, for bf16w, loaded straight from the widened
 *                  panel, whose zero padding covers the last chunk; each B
 *                  tile serves both row halves
 *
 * Loops: panels in groups of 4; K in blocks of 8 A tiles (8, 4 or 2 chunks
 * for 1, 2 or 3 planes, 16 KiB or 12 KiB), each block over the group's
 * panels, so a block of A is read from L1 by every panel of the group after
 * the first; between blocks a panel's C tiles are parked in an f32 buffer
 * (exact, so the sum is the one a single pass over K would give).
 *
 * tdpbf16ps accumulates in f32, like vdpbf16ps treating bf16 subnormal inputs
 * as zero and flushing subnormal results (DAZ/FTZ), in its own summation
 * order.  Epilogue: scale (multiply), bias (add), one rounding to the dtype
 * of x (exact RNE, subnormals kept); only rows < mr and columns < nc are
 * written.  The tile configuration is loaded on entry and released on return.
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

/* Panels per group, whose C tiles are parked in memory between K blocks. */
#define PANELS_PER_GROUP 4
/* 32-k chunks per K block, over the planes: the block's A tiles
 * (CHUNKS_PER_BLOCK * 2 KiB) stay in L1 while the group's panels use them. */
#define CHUNKS_PER_BLOCK 8

/* PREWIDENED: w holds widened panels (include/qkern/woq.h), read straight
 * into the B tiles; else packed int8 panels, widened here chunk by chunk.
 * Rows 16..31 (when mr > 16) reuse each B tile loaded for rows 0..15. */
QK_INLINE void amx_body(const int PREWIDENED, const qk_dtype DT, size_t mr, size_t nc,
                        size_t kc, const void* const* a, const int8_t* w, const float* scale,
                        const float* bias, void* c, ptrdiff_t c_stride) {
  const size_t planes = DT == QK_F32 ? 3 : DT == QK_F16 ? 2 : 1;
  const size_t block = CHUNKS_PER_BLOCK / planes;
  const char* at = (const char*)a[0]; /* packed x: chunk c, plane p at (c * planes + p) * 2 KiB */
  uint16_t bbuf[2][16][32] __attribute__((aligned(64)));
  float acc[PANELS_PER_GROUP][32][32] __attribute__((aligned(64)));
  const int two = mr > 16;
  const size_t groups = (kc + 1) / 2, chunks = (groups + 15) / 16;
  const size_t panel_bytes = PREWIDENED ? chunks * 16 * 128 : groups * 64;

  load_tile_config(mr);
  for (size_t n0 = 0; n0 < nc; n0 += 32 * PANELS_PER_GROUP) {
    const size_t left = (nc - n0 + 31) / 32;
    const size_t panels = left < PANELS_PER_GROUP ? left : PANELS_PER_GROUP;
    const int8_t* wg = w + n0 / 32 * panel_bytes;
    /* K blocks in order, each over the group's panels; with kc = 0 one empty
     * block stores the zeroed tiles. */
    for (size_t c0 = 0; c0 == 0 || c0 < chunks; c0 += block) {
      const size_t c_end = c0 + block < chunks ? c0 + block : chunks;
      for (size_t pn = 0; pn < panels; pn++) {
        const int8_t* wp = wg + pn * panel_bytes;
        float(*cp)[32] = acc[pn];
        if (c0 == 0) {
          _tile_zero(TILE_C00);
          _tile_zero(TILE_C01);
          _tile_zero(TILE_C10);
          _tile_zero(TILE_C11);
        } else {
          _tile_loadd(TILE_C00, &cp[0][0], 128);
          _tile_loadd(TILE_C01, &cp[0][16], 128);
          if (two) {
            _tile_loadd(TILE_C10, &cp[16][0], 128);
            _tile_loadd(TILE_C11, &cp[16][16], 128);
          }
        }
        for (size_t ch = c0; ch < c_end; ch++) {
          if (PREWIDENED) {
            QK_ASAN_CHECK(wp + 2048 * ch, 2048, 0);
            _tile_loadd(TILE_B0, wp + 2048 * ch, 128);
            _tile_loadd(TILE_B1, wp + 2048 * ch + 64, 128);
          } else {
            widen_b(wp + 1024 * ch, groups - 16 * ch < 16 ? groups - 16 * ch : 16, bbuf);
            QK_MEMORY_BARRIER();
            _tile_loadd(TILE_B0, bbuf[0], 64);
            _tile_loadd(TILE_B1, bbuf[1], 64);
          }
          for (size_t p = 0; p < planes; p++) {
            const char* ap = at + (ch * planes + p) * 2048;
            QK_ASAN_CHECK(ap, (two ? 1024 + 64 * (mr - 16) : 64 * mr), 0);
            _tile_loadd(TILE_A0, ap, 64);
            _tile_dpbf16ps(TILE_C00, TILE_A0, TILE_B0);
            _tile_dpbf16ps(TILE_C01, TILE_A0, TILE_B1);
            if (two) {
              _tile_loadd(TILE_A1, ap + 1024, 64);
              _tile_dpbf16ps(TILE_C10, TILE_A1, TILE_B0);
              _tile_dpbf16ps(TILE_C11, TILE_A1, TILE_B1);
            }
          }
        }
        _tile_stored(TILE_C00, &cp[0][0], 128);
        _tile_stored(TILE_C01, &cp[0][16], 128);
        if (two) {
          _tile_stored(TILE_C10, &cp[16][0], 128);
          _tile_stored(TILE_C11, &cp[16][16], 128);
        }
      }
    }
    QK_MEMORY_BARRIER();

    for (size_t pn = 0; pn < panels; pn++) {
      for (size_t h = 0; h < 2; h++) {
        const size_t col = n0 + 32 * pn + 16 * h;
        if (col >= nc) break;
        const __mmask16 mask = qk512_mask(nc - col);
        const __m512 s = _mm512_loadu_ps(scale + col);
        const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
        for (size_t i = 0; i < mr; i++) {
          qk512_epilogue((char*)c + (ptrdiff_t)i * c_stride, col, DT,
                         _mm512_load_ps(&acc[pn][i][16 * h]), s, b, bias != NULL, mask);
        }
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
