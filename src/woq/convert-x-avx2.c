/*
 * convert-x-avx2.c -- converts one row of f16 or bf16 activations to f32,
 * or copies one of f32 (qk_woq_convert_x_fn, include/qkern/woq.h).
 * AVX2 + F16C.
 *
 * Exact: every f16 and bf16 value (subnormals, infinities, NaN payloads
 * included) is an f32 value.  Reads kc elements of row, writes kc floats.
 */
#include <immintrin.h>
#include <string.h>

#include "qkern/woq_ukernels.h"
#include "scalar-convert.h"

void qk_woq_convert_x__avx2(const void* row, qk_dtype dt, size_t kc, float* out) {
  if (dt == QK_F32) {
    memcpy(out, row, kc * sizeof(float));
    return;
  }
  const uint16_t* x = (const uint16_t*)row;
  size_t k = 0;
  if (dt == QK_F16) {
    for (; k + 8 <= kc; k += 8)
      _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + k))));
  } else {
    for (; k + 8 <= kc; k += 8) {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(x + k)));
      _mm256_storeu_ps(out + k, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
  }
  for (; k < kc; k++) out[k] = dt == QK_F16 ? qk_f16_to_f32(x[k]) : qk_bf16_to_f32(x[k]);
}
