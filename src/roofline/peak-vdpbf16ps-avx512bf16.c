/* peak-vdpbf16ps-avx512bf16.c -- 12 independent vdpbf16ps zmm chains per
 * iteration (32 bf16 pairs -> 16 f32 lanes, 64 flops each). */
#include <immintrin.h>
#include <stddef.h>

float qk_peak_loop_vdpbf16ps__avx512bf16(size_t iters) {
  __m512 acc[12];
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_ps((float)j);
  for (size_t i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}
