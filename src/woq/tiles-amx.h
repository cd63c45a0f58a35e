/*
 * tiles-amx.h -- the tiles of the 32x32 AMX kernels of src/woq:
 * their numbering, their configuration for mr rows, and the tdpbf16ps of
 * one chunk of packed x against the loaded B tiles.  AMX-TILE and
 * AMX-BF16 instructions: include it from *-amx.c files only.
 *
 *   C  tmm0..tmm3  rows 0..15 / 16..31 x columns 0..15 / 16..31, f32
 *   A  tmm4, tmm5  rows 0..15 / 16..31 x 32 bf16 of one 32-k chunk and
 *                  one plane of packed x: 1 KiB contiguous each
 *   B  tmm6, tmm7  16 k-pairs x columns 0..15 / 16..31, bf16 pairs
 */
#ifndef QKERN_TILES_AMX_H
#define QKERN_TILES_AMX_H

#include "../amx/tilecfg-amx.h"
#include "sanitize.h"

#define QK_TILE_C00 0
#define QK_TILE_C01 1
#define QK_TILE_C10 2
#define QK_TILE_C11 3
#define QK_TILE_A0 4
#define QK_TILE_A1 5
#define QK_TILE_B0 6
#define QK_TILE_B1 7

/* Configures the tiles for mr (1..32) rows: A and C tiles of the first
 * half hold min(mr, 16) rows, of the second mr - 16 (1 when unused), B
 * tiles 16; every tile row is 64 bytes. */
static inline __attribute__((always_inline)) void qk_tile_config_32x32(size_t mr) {
  uint8_t rows[8];
  const uint8_t rows0 = (uint8_t)(mr < 16 ? mr : 16);
  const uint8_t rows1 = (uint8_t)(mr > 16 ? mr - 16 : 1);
  rows[QK_TILE_C00] = rows[QK_TILE_C01] = rows[QK_TILE_A0] = rows0;
  rows[QK_TILE_C10] = rows[QK_TILE_C11] = rows[QK_TILE_A1] = rows1;
  rows[QK_TILE_B0] = rows[QK_TILE_B1] = 16;
  qk_tile_config_load(rows);
}

/* C += A B for the `planes` planes of one chunk of x from xp (planes 2 KiB
 * apart) and mr rows of packed x, or mr columns of packed x^T: packed x
 * in the A tiles against the B tiles already loaded (X_IN_B 0), or packed
 * x^T in the B tiles against the A tiles already loaded (1); per plane,
 * rows (columns) 0..15, then (mr > 16) 16..31, each against both loaded
 * tiles.  (A B tile of packed x^T holds all 16 pairs of k of its columns,
 * so it is read whole.)  The tile intrinsics take literal tile numbers,
 * hence the two branches. */
static inline __attribute__((always_inline)) void qk_tile_dpbf16ps_chunk(const int X_IN_B,
                                                                         const char* xp,
                                                                         size_t planes, size_t mr) {
  const int two = mr > 16;
  for (size_t p = 0; p < planes; p++, xp += 2048) {
    QK_ASAN_CHECK(xp, X_IN_B ? (two ? 2048 : 1024) : two ? 1024 + 64 * (mr - 16) : 64 * mr, 0);
    if (X_IN_B) {
      _tile_loadd(QK_TILE_B0, xp, 64);
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C10, QK_TILE_A1, QK_TILE_B0);
    } else {
      _tile_loadd(QK_TILE_A0, xp, 64);
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C01, QK_TILE_A0, QK_TILE_B1);
    }
    if (two && X_IN_B) {
      _tile_loadd(QK_TILE_B1, xp + 1024, 64);
      _tile_dpbf16ps(QK_TILE_C01, QK_TILE_A0, QK_TILE_B1);
    } else if (two) {
      _tile_loadd(QK_TILE_A1, xp + 1024, 64);
      _tile_dpbf16ps(QK_TILE_C10, QK_TILE_A1, QK_TILE_B0);
    }
    if (two) _tile_dpbf16ps(QK_TILE_C11, QK_TILE_A1, QK_TILE_B1);
  }
}

#endif /* QKERN_TILES_AMX_H */
