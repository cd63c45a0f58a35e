/* peak-vfmadd231ps-avx2.c -- 12 independent vfmadd231ps ymm chains per
 * iteration (enough to cover latency x ports on current x86 cores). */
#include <immintrin.h>
#include <stddef.h>

float qk_peak_loop_vfmadd231ps__avx2(size_t iters) {
  __m256 acc[12];
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int j = 0; j < 12; j++) acc[j] = _mm256_set1_ps((float)j);
  for (size_t i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  __m256 s = acc[0];
  for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, acc[j]);
  return _mm256_cvtss_f32(s);
}
