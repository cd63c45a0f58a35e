/*
 * amx_tile_loads.c -- the throughput of the AMX kernels' step (two A tiles,
 * two B tiles, four tdpbf16ps: src/woq/tiles-amx.h) with A and B read from
 * buffers of chosen sizes, cycled through, and B loaded with tileloadd or
 * with the non-temporal tileloaddt1, in GFLOP/s of one thread against the
 * same step on tiles that stay in L1.  Build and run on a CPU with AMX:
 *
 *   cc -O2 -mamx-tile -mamx-bf16 benchmarks/amx_tile_loads.c -o amx_tile_loads \
 *       && ./amx_tile_loads
 *
 * A 32 KiB A block read from L1 while B streams from a 512 KiB block in
 * L2 is the bf16w kernel's sub-block (src/woq/bf16-gemm-x32c2-amx.c).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STEPS 2000000L
#define STEP_FLOPS (4.0 * 2 * 16 * 16 * 32) /* four 16x16x32 tile products */

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Palette 1, tiles 0..7 of 16 rows of 64 bytes. */
static void configure_tiles(void) {
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

/* Seconds for STEPS steps, A read from the first a_bytes of a and B from
 * the first b_bytes of b, 2 KiB of each per step, in turn. */
static double run(const char* a, size_t a_bytes, const char* b, size_t b_bytes, int stream_b) {
  configure_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  size_t ao = 0, bo = 0;
  const double t0 = seconds();
  for (long s = 0; s < STEPS; s++) {
    if (stream_b) {
      _tile_stream_loadd(6, b + bo, 128);
      _tile_stream_loadd(7, b + bo + 64, 128);
    } else {
      _tile_loadd(6, b + bo, 128);
      _tile_loadd(7, b + bo + 64, 128);
    }
    _tile_loadd(4, a + ao, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + ao + 1024, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    ao = ao + 2048 < a_bytes ? ao + 2048 : 0;
    bo = bo + 2048 < b_bytes ? bo + 2048 : 0;
  }
  float c[16][16] __attribute__((aligned(64)));
  _tile_stored(0, c, 64);
  _tile_release();
  const double t = seconds() - t0;
  if (c[0][0] != 0.0f) puts("nonzero"); /* the buffers hold zeros: keeps c live */
  return t;
}

int main(void) {
  /* Linux grants the tile state per process (XFEATURE_XTILEDATA, 18) */
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    fputs("no AMX tile state from the kernel\n", stderr);
    return 1;
  }
  const size_t buffer = (size_t)64 << 20;
  char* a = aligned_alloc(64, buffer);
  char* b = aligned_alloc(64, buffer);
  if (!a || !b) return 1;
  memset(a, 0, buffer);
  memset(b, 0, buffer);
  static const size_t sizes[][2] = {
      {4096, 4096},        /* both in L1: the peak of the step */
      {32768, 524288},     /* A in L1, B from L2: the bf16w kernel */
      {65536, 524288},     /* A past L1 */
      {524288, 524288},    /* both from L2 */
      {32768, 64u << 20}}; /* B from memory */
  double peak = 0;
  printf("%9s %9s %-11s %9s %7s\n", "A KiB", "B KiB", "B loads", "GFLOP/s", "% peak");
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    for (int stream_b = 0; stream_b < 2; stream_b++) {
      double best = 1e30;
      for (int r = 0; r < 5; r++) {
        const double t = run(a, sizes[i][0], b, sizes[i][1], stream_b);
        best = t < best ? t : best;
      }
      const double gflops = STEPS * STEP_FLOPS / best * 1e-9;
      if (i == 0 && gflops > peak) peak = gflops;
      printf("%9zu %9zu %-11s %9.0f %7.0f\n", sizes[i][0] >> 10, sizes[i][1] >> 10,
             stream_b ? "tileloaddt1" : "tileloadd", gflops, 100 * gflops / peak);
    }
  free(a);
  free(b);
  return 0;
}
