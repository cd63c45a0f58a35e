/*
 * roofline.c -- the peak-loop table and the timed drivers for peak
 * instruction rate and DRAM read bandwidth.  Baseline flags + OpenMP (the
 * read loop uses SSE2, part of baseline x86-64).
 */
#include "qkern/roofline.h"

#include <emmintrin.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

float qk_peak_loop_vfmadd231ps__avx2(size_t iters);
float qk_peak_loop_vfmadd231ps__avx512(size_t iters);
float qk_peak_loop_vdpbf16ps__avx512bf16(size_t iters);
float qk_peak_loop_tdpbf16ps__amx(size_t iters);

/* Flops per iteration: accumulators x lanes x (2 per multiply-add). */
const qk_peak_entry qk_peak_loops[] = {
#ifdef QKERN_HAVE_AVX2
    {"vfmadd231ps ymm", qk_peak_loop_vfmadd231ps__avx2, QK_ISA_AVX2, 12 * 8 * 2},
#endif
#ifdef QKERN_HAVE_AVX512
    {"vfmadd231ps zmm", qk_peak_loop_vfmadd231ps__avx512, QK_ISA_AVX512, 12 * 16 * 2},
#endif
#ifdef QKERN_HAVE_AVX512_BF16
    {"vdpbf16ps zmm", qk_peak_loop_vdpbf16ps__avx512bf16, QK_ISA_AVX512_BF16, 12 * 32 * 2},
#endif
#ifdef QKERN_HAVE_AMX
    {"tdpbf16ps", qk_peak_loop_tdpbf16ps__amx, QK_ISA_AMX, 4 * 16 * 16 * 32 * 2},
#endif
};
const size_t qk_num_peak_loops = sizeof(qk_peak_loops) / sizeof(qk_peak_loops[0]);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile float peak_sink;

double qk_peak_run(size_t index, size_t iters, int threads) {
  if (index >= qk_num_peak_loops || threads < 1) return -1.0;
  const qk_peak_loop_fn fn = qk_peak_loops[index].fn;
  const double t0 = now();
#pragma omp parallel num_threads(threads)
  {
#pragma omp atomic write
    peak_sink = fn(iters);
  }
  return now() - t0;
}

double qk_read_run(const void* buf, size_t bytes, int threads, uint64_t* checksum) {
  const size_t lines = bytes / 64;
  uint64_t total = 0;
  const double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
  for (size_t t = 0; t < (size_t)threads; t++) {
    const __m128i* p = (const __m128i*)buf + 4 * (lines * t / threads);
    const __m128i* end = (const __m128i*)buf + 4 * (lines * (t + 1) / threads);
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < end; p += 4) {
      a0 = _mm_add_epi64(a0, _mm_load_si128(p));
      a1 = _mm_add_epi64(a1, _mm_load_si128(p + 1));
      a2 = _mm_add_epi64(a2, _mm_load_si128(p + 2));
      a3 = _mm_add_epi64(a3, _mm_load_si128(p + 3));
    }
    const __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    total += (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
  }
  *checksum = total;
  return now() - t0;
}
