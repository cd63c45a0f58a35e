/* peak-vfmadd231ps-avx512.c -- 12 independent vfmadd231ps zmm chains per
 * iteration. */
#include <immintrin.h>
#include <stddef.h>

float qk_peak_loop_vfmadd231ps__avx512(size_t iters) {
  __m512 acc[12];
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_ps((float)j);
  for (size_t i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}
