/*
 * amx_on_avx2.h -- the AMX-TILE and AMX-BF16 intrinsics the kernels use,
 * in C, for tests only.  Force-included (-include) after avx512_on_avx2.h
 * before an AMX kernel source compiled with AVX2 flags: the eight tiles
 * are thread-local arrays here, and each intrinsic does what the Intel SDM
 * says of its instruction, with the checks that make the hardware fault
 * turned into an abort (a tile used unconfigured, shapes that do not
 * match, a configuration beyond palette 1).  GCC's own (macros, or inline
 * functions of immintrin.h, which the AVX-512 prelude has included) are
 * replaced.  Loads and stores copy only
 * the configured rows and bytes, so AddressSanitizer sees exactly what a
 * tile instruction would touch.  tests/woq/test_emulated.py builds the
 * AMX kernels with it.
 */
#ifndef QKERN_TESTS_AMX_ON_AVX2_H
#define QKERN_TESTS_AMX_ON_AVX2_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The tile state of palette 1: 8 tiles of up to 16 rows of 64 bytes. */
typedef struct qk_emu_tiles {
  int configured;
  uint8_t rows[8];
  uint16_t colsb[8];
  uint8_t data[8][16][64];
} qk_emu_tiles;
static __thread qk_emu_tiles qk_emu_amx;

/* The tile t, which must be configured (the hardware raises #UD). */
static inline qk_emu_tiles* qk_emu_tile(int t) {
  if (!qk_emu_amx.configured || t < 0 || t > 7 || qk_emu_amx.rows[t] == 0) abort();
  return &qk_emu_amx;
}

/* ldtilecfg: palette 1, start_row 0, the reserved bytes 2..15 zero, rows
 * <= 16 and colsb <= 64 of each tile (both 0, or neither), tiles 8..15
 * unused; all tiles zeroed. */
static inline void qk_emu_tile_loadconfig(const void* config) {
  uint8_t cfg[64];
  memcpy(cfg, config, 64);
  memset(&qk_emu_amx, 0, sizeof(qk_emu_amx));
  if (cfg[0] == 0) return; /* palette 0: the tile state released */
  if (cfg[0] != 1 || cfg[1] != 0) abort();
  for (int b = 2; b < 16; b++)
    if (cfg[b]) abort();
  for (int t = 0; t < 16; t++) {
    uint16_t colsb;
    memcpy(&colsb, cfg + 16 + 2 * t, 2);
    const uint8_t rows = cfg[48 + t];
    if (t >= 8 ? colsb || rows : colsb > 64 || rows > 16 || !colsb != !rows) abort();
    if (t < 8) {
      qk_emu_amx.rows[t] = rows;
      qk_emu_amx.colsb[t] = colsb;
    }
  }
  qk_emu_amx.configured = 1;
}

static inline void qk_emu_tile_release(void) { memset(&qk_emu_amx, 0, sizeof(qk_emu_amx)); }

static inline void qk_emu_tile_zero(int t) { memset(qk_emu_tile(t)->data[t], 0, 16 * 64); }

/* tileloadd: the configured rows and bytes from base, rows stride bytes
 * apart; the rest of the tile zero. */
static inline void qk_emu_tile_loadd(int t, const void* base, long stride) {
  qk_emu_tiles* s = qk_emu_tile(t);
  memset(s->data[t], 0, 16 * 64);
  for (int r = 0; r < s->rows[t]; r++)
    memcpy(s->data[t][r], (const char*)base + r * stride, s->colsb[t]);
}

/* tilestored: the configured rows and bytes to base, stride bytes apart. */
static inline void qk_emu_tile_stored(int t, void* base, long stride) {
  qk_emu_tiles* s = qk_emu_tile(t);
  for (int r = 0; r < s->rows[t]; r++) memcpy((char*)base + r * stride, s->data[t][r], s->colsb[t]);
}

/* tdpbf16ps c += a b, in the order of the SDM's pseudo-code: for each
 * row m, each pair k of a's row (k of b's rows) and each column n,
 * c[m][n] += a[m][2k] b[k][2n], then += a[m][2k+1] b[k][2n+1]; each
 * product exact, each add rounded to nearest even, subnormal inputs
 * (the accumulator too) taken as zero and subnormal results flushed
 * (qk_emu_daz, qk_emu_bf16 of avx512_on_avx2.h).  Three distinct tiles
 * and shapes as the SDM requires: a's and c's rows alike, a's pairs = b's
 * rows, b's and c's bytes per row alike. */
static inline void qk_emu_tile_dpbf16ps(int c, int a, int b) {
  qk_emu_tiles* s = qk_emu_tile(c);
  qk_emu_tile(a);
  qk_emu_tile(b);
  if (c == a || c == b || a == b || s->rows[c] != s->rows[a] || s->colsb[a] / 4 != s->rows[b] ||
      s->colsb[b] != s->colsb[c] || s->colsb[c] % 4 || s->colsb[a] % 4)
    abort();
  for (int m = 0; m < s->rows[c]; m++)
    for (int n = 0; n < s->colsb[c] / 4; n++) {
      float acc;
      memcpy(&acc, s->data[c][m] + 4 * n, 4);
      acc = qk_emu_daz(acc);
      for (int k = 0; k < s->rows[b]; k++)
        for (int h = 0; h < 2; h++) {
          uint16_t x, y;
          memcpy(&x, s->data[a][m] + 4 * k + 2 * h, 2);
          memcpy(&y, s->data[b][k] + 4 * n + 2 * h, 2);
          acc = qk_emu_daz(fmaf(qk_emu_bf16(x), qk_emu_bf16(y), acc));
        }
      memcpy(s->data[c][m] + 4 * n, &acc, 4);
    }
}

#undef _tile_loadconfig
#define _tile_loadconfig(config) qk_emu_tile_loadconfig(config)
#undef _tile_release
#define _tile_release() qk_emu_tile_release()
#undef _tile_zero
#define _tile_zero(t) qk_emu_tile_zero(t)
#undef _tile_loadd
#define _tile_loadd(t, base, stride) qk_emu_tile_loadd(t, base, (long)(stride))
#undef _tile_stream_loadd
#define _tile_stream_loadd(t, base, stride) qk_emu_tile_loadd(t, base, (long)(stride))
#undef _tile_stored
#define _tile_stored(t, base, stride) qk_emu_tile_stored(t, base, (long)(stride))
#undef _tile_dpbf16ps
#define _tile_dpbf16ps(c, a, b) qk_emu_tile_dpbf16ps(c, a, b)

#endif /* QKERN_TESTS_AMX_ON_AVX2_H */
