/*
 * amx_tile_loads.c -- the throughput of the AMX kernels' step (two A tiles,
 * two B tiles, four tdpbf16ps: src/woq/tiles-amx.h) with A and B read from
 * buffers of chosen sizes, cycled through, and B loaded with tileloadd or
 * with the non-temporal tileloaddt1, in GFLOP/s of one thread against the
 * same step on tiles that stay in L1; then the step (tiles in L1) beside
 * other zmm work in the same loop, in ns per step: 32 vpsrad (port 0), 32
 * vpermw (port 5), or the widening of one 32-k chunk of int8 weights to
 * bf16 as the AMX kernels widen it (qk512_widen_group, src/woq/io-avx512.h,
 * from and to L1).  Work that shares no resource with the tile unit runs
 * in the step's shadow.  Last, ns per tdpbf16ps by the rows of its A (and
 * C) tiles, 1 to 16: four independent products a loop, and one chain into
 * one C tile, tiles in registers (what a call with M below 16 pays).
 * Build and run on a CPU with AMX:
 *
 *   cc -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bw -mavx512vl -Iinclude -Isrc/woq \
 *       benchmarks/amx_tile_loads.c src/cpu/cpu_detect.c -o amx_tile_loads && ./amx_tile_loads
 *
 * A 32 KiB A block read from L1 while B streams from a 512 KiB block in
 * L2 is the bf16w kernel's sub-block (src/woq/bf16-gemm-x32c2-amx.c).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io-avx512.h"
#include "qkern/cpu.h"
#include "tiles-amx.h"

#define STEPS 2000000L
#define STEP_FLOPS (4.0 * 2 * 16 * 16 * 32) /* four 16x16x32 tile products */

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The tiles of a 32-row step (src/woq/tiles-amx.h), the C tiles zeroed. */
static void start_tiles(void) {
  qk_tile_config_32x32(32);
  _tile_zero(QK_TILE_C00);
  _tile_zero(QK_TILE_C01);
  _tile_zero(QK_TILE_C10);
  _tile_zero(QK_TILE_C11);
}

/* The AMX kernels' step: B tiles from b (tileloaddt1 when stream_b), then
 * the two A tiles from a and four tdpbf16ps (qk_tile_dpbf16ps_chunk). */
static inline __attribute__((always_inline)) void step(const char* a, const char* b, int stream_b) {
  if (stream_b) {
    _tile_stream_loadd(QK_TILE_B0, b, 128);
    _tile_stream_loadd(QK_TILE_B1, b + 64, 128);
  } else {
    _tile_loadd(QK_TILE_B0, b, 128);
    _tile_loadd(QK_TILE_B1, b + 64, 128);
  }
  qk_tile_dpbf16ps_chunk(0, a, 1, 32);
}

/* Seconds for STEPS steps, A read from the first a_bytes of a and B from
 * the first b_bytes of b, 2 KiB of each per step, in turn. */
static double run(const char* a, size_t a_bytes, const char* b, size_t b_bytes, int stream_b) {
  start_tiles();
  size_t ao = 0, bo = 0;
  const double t0 = seconds();
  for (long s = 0; s < STEPS; s++) {
    step(a + ao, b + bo, stream_b);
    ao = ao + 2048 < a_bytes ? ao + 2048 : 0;
    bo = bo + 2048 < b_bytes ? bo + 2048 : 0;
  }
  float c[16][16] __attribute__((aligned(64)));
  _tile_stored(QK_TILE_C00, c, 64);
  _tile_release();
  const double t = seconds() - t0;
  if (c[0][0] != 0.0f) puts("nonzero"); /* the buffers hold zeros: keeps c live */
  return t;
}

enum beside { NOTHING, SHIFTS, PERMUTES, WIDENING };

/* Nanoseconds per step of `steps` iterations of `work` (and, when tiles,
 * the step on tiles in L1 at a and b), the widening reading w and writing
 * dst (both in L1). */
static double run_beside(enum beside work, int tiles, const char* a, const char* b, const int8_t* w,
                         char* dst, long steps) {
  start_tiles();
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  __m512i v0 = _mm512_set1_epi32(1), v1 = _mm512_set1_epi32(2), v2 = _mm512_set1_epi32(3),
          v3 = _mm512_set1_epi32(4), r0 = v0, r1 = v1, r2 = v2, r3 = v3;
  const double t0 = seconds();
  for (long s = 0; s < steps; s++) {
    if (work == WIDENING) {
      for (size_t g = 0; g < 16; g++) qk512_widen_group(2, w + 64 * g, idx, dst + 128 * g, 0);
      __asm__ volatile("" ::: "memory");
    } else if (work != NOTHING) {
      for (int i = 0; i < 8; i++) {
        if (work == SHIFTS) {
          r0 = _mm512_srai_epi32(v0, 3);
          r1 = _mm512_srai_epi32(v1, 3);
          r2 = _mm512_srai_epi32(v2, 3);
          r3 = _mm512_srai_epi32(v3, 3);
        } else {
          r0 = _mm512_permutexvar_epi16(idx, v0);
          r1 = _mm512_permutexvar_epi16(idx, v1);
          r2 = _mm512_permutexvar_epi16(idx, v2);
          r3 = _mm512_permutexvar_epi16(idx, v3);
        }
        /* the inputs stay opaque, so nothing is hoisted; the results are kept */
        __asm__ volatile(""
                         : "+v"(r0), "+v"(r1), "+v"(r2), "+v"(r3), "+v"(v0), "+v"(v1), "+v"(v2),
                           "+v"(v3));
      }
    }
    if (tiles) step(a, b, 0);
  }
  _tile_release();
  const double t = seconds() - t0;
  if (_mm512_reduce_add_epi32(_mm512_add_epi32(r0, r3)) == 1) puts(""); /* keeps r live */
  return t / (double)steps * 1e9;
}

/* Nanoseconds per tdpbf16ps with A and C tiles of `rows` rows: four into
 * the four C tiles (chain 0) or all into C00 (chain 1), `steps` times. */
static double run_rows(int rows, int chain, long steps) {
  uint8_t cfg_rows[8];
  for (int t = 0; t < 8; t++) cfg_rows[t] = (uint8_t)rows;
  cfg_rows[QK_TILE_B0] = cfg_rows[QK_TILE_B1] = 16;
  qk_tile_config_load(cfg_rows);
  _tile_zero(QK_TILE_A0);
  _tile_zero(QK_TILE_A1);
  _tile_zero(QK_TILE_B0);
  _tile_zero(QK_TILE_B1);
  _tile_zero(QK_TILE_C00);
  _tile_zero(QK_TILE_C01);
  _tile_zero(QK_TILE_C10);
  _tile_zero(QK_TILE_C11);
  const double t0 = seconds();
  for (long s = 0; s < steps; s++)
    if (chain) {
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B1);
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B1);
    } else {
      _tile_dpbf16ps(QK_TILE_C00, QK_TILE_A0, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C01, QK_TILE_A0, QK_TILE_B1);
      _tile_dpbf16ps(QK_TILE_C10, QK_TILE_A1, QK_TILE_B0);
      _tile_dpbf16ps(QK_TILE_C11, QK_TILE_A1, QK_TILE_B1);
    }
  _tile_release();
  return (seconds() - t0) / (4.0 * (double)steps) * 1e9;
}

int main(void) {
  qk_cpu_features cpu; /* which also asks Linux for this process's tile state */
  qk_cpu_detect(&cpu);
  if (!cpu.amx_bf16) {
    fputs("no AMX-BF16 on this CPU, or no tile state from the kernel\n", stderr);
    return 1;
  }
  const size_t buffer = (size_t)64 << 20;
  char* a = aligned_alloc(64, buffer);
  char* b = aligned_alloc(64, buffer);
  if (!a || !b) return 1;
  memset(a, 0, buffer);
  memset(b, 0, buffer);
  static const size_t sizes[][2] = {{4096, 4096},        /* both in L1: the peak of the step */
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
  static const char* const work_names[] = {"nothing", "32 vpsrad", "32 vpermw", "widen a chunk"};
  char* dst = aligned_alloc(64, 2048);
  if (!dst) return 1;
  printf("\n%-14s %9s %12s %12s\n", "beside", "alone ns", "with step ns", "step alone ns");
  for (int work = NOTHING; work <= WIDENING; work++) {
    double alone = 1e30, both = 1e30, step = 1e30;
    for (int r = 0; r < 5; r++) {
      const long steps = STEPS / 5;
      const double t_alone = run_beside(work, 0, a, b, (const int8_t*)b, dst, steps);
      const double t_both = run_beside(work, 1, a, b, (const int8_t*)b, dst, steps);
      const double t_step = run_beside(NOTHING, 1, a, b, (const int8_t*)b, dst, steps);
      alone = t_alone < alone ? t_alone : alone;
      both = t_both < both ? t_both : both;
      step = t_step < step ? t_step : step;
    }
    printf("%-14s %9.1f %12.1f %12.1f\n", work_names[work], alone, both, step);
  }
  printf("\n%6s %16s %12s\n", "A rows", "independent ns", "chain ns");
  for (int rows = 1; rows <= 16; rows *= 2) {
    double independent = 1e30, chain = 1e30;
    for (int r = 0; r < 5; r++) {
      const double t_independent = run_rows(rows, 0, STEPS / 5);
      const double t_chain = run_rows(rows, 1, STEPS / 5);
      independent = t_independent < independent ? t_independent : independent;
      chain = t_chain < chain ? t_chain : chain;
    }
    printf("%6d %16.2f %12.2f\n", rows, independent, chain);
  }
  free(dst);
  free(a);
  free(b);
  return 0;
}
