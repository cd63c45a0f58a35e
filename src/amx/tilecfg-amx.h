/*
 * tilecfg-amx.h -- the AMX tile configuration, one definition for the AMX
 * kernels (the files *-amx.c of src/woq) and the tdpbf16ps peak loop
 * (src/roofline/peak-tdpbf16ps-amx.c).  AMX-TILE instructions: include it
 * from *-amx.c files only.
 */
#ifndef QKERN_TILECFG_AMX_H
#define QKERN_TILECFG_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

/* Configures tiles 0..7 with 64-byte rows, rows[t] of them (0: tile t
 * unused), palette 1. */
static inline __attribute__((always_inline)) void qk_tile_config_load(const uint8_t rows[8]) {
  qk_tilecfg cfg __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = rows[t] ? 64 : 0;
  }
  QK_MEMORY_BARRIER();
  _tile_loadconfig(&cfg);
}

#endif /* QKERN_TILECFG_AMX_H */
