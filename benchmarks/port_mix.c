/*
 * port_mix.c -- throughput of the zmm instructions the AVX-512 WoQ kernels
 * issue, alone and in pairs, in core cycles (clock measured by a chain of
 * dependent integer adds, one per cycle).  Two instructions that share no
 * port run a mix of 4 + 4 in the time of 4 alone; two that share every
 * port, in the time of 8.  Build and run on a CPU with AVX-512-BF16 and
 * VBMI (vpermb):
 *
 *   cc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mavx512vbmi -mfma \
 *       benchmarks/port_mix.c -o port_mix && ./port_mix
 *
 * Each loop iteration issues eight independent instructions on inputs an
 * empty asm statement keeps in registers, their results consumed by
 * another, so no dependency chain limits them (an instruction that
 * overwrites an input, as the FMAs, vdpbf16ps and vpermt2w do, gets a
 * register copy before it, which costs no port: eight copies alone run in
 * two cycles).  Memory operands (the broadcasts, the zero-extensions) read
 * L1 through a pointer the compiler cannot hoist, a different address for
 * each of the eight.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERATIONS 20000000L

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Core cycles per second: four dependent 64-bit multiplies per iteration,
 * 3 cycles each on the Intel and AMD cores of this project (a chain of
 * adds of an immediate ran at 10 "GHz" on an Emerald Rapids, whose
 * renamer folds them). */
static double clock_hz(void) {
  long x = 1, one = 1;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    const double t0 = seconds();
    for (long i = 0; i < 4 * ITERATIONS; i++)
      __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0"
                       : "+r"(x)
                       : "r"(one));
    const double dt = seconds() - t0;
    if (dt < best) best = dt;
  }
  return 3.0 * 16.0 * ITERATIONS / best;
}

/* Register inputs: normal floats to the FMAs (on a subnormal input an Intel
 * core takes a microcode assist: 1800 cycles for eight), any bits to the
 * others. */
#define NORMAL(n) _mm512_set1_epi32(0x3f800000 + (n))

#define KEEP(v) __asm__ volatile("" : "+v"(v))
#define USE(v) __asm__ volatile("" ::"v"(v))

static int line[64] __attribute__((aligned(64))); /* 8 x 32 bytes */

/* The instructions, each on register r (or the L1 line) with t. */
#define VPERMW(r, n) USE(_mm512_permutexvar_epi16(r, t));
#define VPERMB(r, n) USE(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, r, t));
#define VPERMPS(r, n) USE(_mm512_permutexvar_ps(r, _mm512_castsi512_ps(t)));
#define VPERMT2W(r, n) USE(_mm512_permutex2var_epi16(r, t, u));
#define VPSRLW(r, n) USE(_mm512_srli_epi16(r, 4));
#define VPSRLD(r, n) USE(_mm512_srli_epi32(r, 4));
#define VCVTDQ2PS(r, n) USE(_mm512_cvtepi32_ps(r));
#define VPMOVZXBW(r, n) USE(_mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)p + n)));
#define VPMOVZXBD(r, n) USE(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)p + n)));
#define VFMADD(r, n) \
  USE(_mm512_fmadd_ps(_mm512_castsi512_ps(r), _mm512_castsi512_ps(t), _mm512_castsi512_ps(u)));
#define VDPBF16PS(r, n) USE(_mm512_dpbf16_ps(_mm512_castsi512_ps(r), (__m512bh)t, (__m512bh)u));
#define VBROADCASTSS(r, n) USE(_mm512_set1_ps(((const float*)p)[n]));
#define VPBROADCASTD(r, n) USE(_mm512_set1_epi32(((const int*)p)[n]));

#define FOUR(OP, a, b, c, d, n) OP(a, n) OP(b, n + 1) OP(c, n + 2) OP(d, n + 3)

/* Cycles per iteration of eight instructions: FIRST on four registers,
 * SECOND on four more. */
#define MIX(hz, FIRST, SECOND)                                                              \
  do {                                                                                      \
    __m512i r0 = NORMAL(1), r1 = NORMAL(2), r2 = NORMAL(3), r3 = NORMAL(4), r4 = NORMAL(5), \
            r5 = NORMAL(6), r6 = NORMAL(7), r7 = NORMAL(8);                                 \
    __m512i t = _mm512_set1_epi16(0x3f80), u = _mm512_set1_epi16(0x4000);                   \
    const char* p = (const char*)line;                                                      \
    double best = 1e30;                                                                     \
    for (int rep = 0; rep < 5; rep++) {                                                     \
      const double t0 = seconds();                                                          \
      for (long i = 0; i < ITERATIONS; i++) {                                               \
        KEEP(r0);                                                                           \
        KEEP(r1);                                                                           \
        KEEP(r2);                                                                           \
        KEEP(r3);                                                                           \
        KEEP(r4);                                                                           \
        KEEP(r5);                                                                           \
        KEEP(r6);                                                                           \
        KEEP(r7);                                                                           \
        KEEP(t);                                                                            \
        KEEP(u);                                                                            \
        __asm__ volatile("" : "+r"(p));                                                     \
        FOUR(FIRST, r0, r1, r2, r3, 0) FOUR(SECOND, r4, r5, r6, r7, 4)                      \
      }                                                                                     \
      const double dt = seconds() - t0;                                                     \
      if (dt < best) best = dt;                                                             \
    }                                                                                       \
    printf("%-14s + %-14s %6.2f\n", #FIRST, #SECOND, hz* best / ITERATIONS);                \
  } while (0)

int main(void) {
  const double hz = clock_hz();
  printf(
      "clock %.2f GHz; cycles per 4 + 4 instructions (4: no shared port, 8: all "
      "shared)\n",
      hz * 1e-9);
  MIX(hz, VPERMW, VPERMW);
  MIX(hz, VPERMPS, VPERMPS);
  MIX(hz, VPERMT2W, VPERMT2W);
  MIX(hz, VPERMB, VPERMB);
  MIX(hz, VPMOVZXBW, VPMOVZXBW);
  MIX(hz, VPMOVZXBD, VPMOVZXBD);
  MIX(hz, VPSRLW, VPSRLW);
  MIX(hz, VPSRLD, VPSRLD);
  MIX(hz, VCVTDQ2PS, VCVTDQ2PS);
  MIX(hz, VFMADD, VFMADD);
  MIX(hz, VDPBF16PS, VDPBF16PS);
  MIX(hz, VBROADCASTSS, VBROADCASTSS);
  MIX(hz, VPBROADCASTD, VPBROADCASTD);
  MIX(hz, VPERMW, VPERMPS);
  MIX(hz, VPERMW, VPMOVZXBW);
  MIX(hz, VPERMB, VPERMW);
  MIX(hz, VPERMB, VPSRLW);
  MIX(hz, VPERMB, VDPBF16PS);
  MIX(hz, VPERMPS, VPMOVZXBD);
  MIX(hz, VPERMW, VPSRLW);
  MIX(hz, VPERMPS, VPSRLD);
  MIX(hz, VPERMPS, VCVTDQ2PS);
  MIX(hz, VPSRLD, VCVTDQ2PS);
  MIX(hz, VPERMW, VDPBF16PS);
  MIX(hz, VPERMPS, VFMADD);
  MIX(hz, VCVTDQ2PS, VFMADD);
  MIX(hz, VPSRLD, VFMADD);
  MIX(hz, VPSRLW, VDPBF16PS);
  MIX(hz, VPERMT2W, VFMADD);
  MIX(hz, VPERMT2W, VDPBF16PS);
  MIX(hz, VPERMT2W, VPERMW);
  MIX(hz, VBROADCASTSS, VFMADD);
  MIX(hz, VPBROADCASTD, VFMADD);
  MIX(hz, VBROADCASTSS, VPERMW);
  return 0;
}
