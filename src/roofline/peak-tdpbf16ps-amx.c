/* peak-tdpbf16ps-amx.c -- four independent tdpbf16ps (16x32 bf16 A, 16 k-pair
 * x 16 B, 16x16 f32 C) per iteration, operands resident in tiles. */
#include <stddef.h>

#include "../amx/tilecfg-amx.h"

float qk_peak_loop_tdpbf16ps__amx(size_t iters) {
  static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 0, 0}; /* C0-C3, A, B */
  uint16_t ab[16][32] __attribute__((aligned(64)));
  float c[16][16] __attribute__((aligned(64)));
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 32; j++) ab[i][j] = 0x3a83; /* 1e-3 in bf16 */
  qk_tile_config_load(rows);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (size_t i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  QK_MEMORY_BARRIER();
  return c[0][0];
}
