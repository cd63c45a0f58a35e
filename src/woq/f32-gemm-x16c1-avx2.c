/*
 * f32-gemm-x16c1-avx2.c -- WoQ GEMM micro-kernels 1x16c1 and 4x16c1,
 * AVX2 + FMA + F16C.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h), packed layout nr = 16,
 * kr = 1.  x in f32, f16 or bf16, widened to f32 and broadcast; the 16
 * int8 weights of one k widened in-register to two vectors of 8 f32; fp32 FMA
 * accumulation in increasing k.  Epilogue: scale (multiply), bias (add), one
 * rounding to the output dtype.  Rows mr..MR-1 duplicate row mr-1.
 */
#include <immintrin.h>
#include <string.h>

#include "ukernel-define.h"

QK_INLINE __m256 i8_to_f32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

QK_INLINE __m256 bcast_x(const char* row, size_t k, qk_dtype DT) {
  if (DT == QK_F32) return _mm256_broadcast_ss((const float*)row + k);
  uint16_t h;
  memcpy(&h, row + 2 * k, 2);
  if (DT == QK_F16) return _mm256_set1_ps(_cvtsh_ss(h));
  return _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)h << 16)));
}

/* f32 -> bf16 bits (round to nearest even, NaN kept quiet) in 8 x u16. */
QK_INLINE __m128i f32_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* Stores the first `count` (<= 8) lanes of v at element n of a dtype-DT row. */
QK_INLINE void store_row(char* row, size_t n, qk_dtype DT, __m256 v, size_t count) {
  if (DT == QK_F32) {
    if (count >= 8) {
      _mm256_storeu_ps((float*)row + n, v);
    } else {
      float tmp[8];
      _mm256_storeu_ps(tmp, v);
      memcpy(row + 4 * n, tmp, 4 * count);
    }
    return;
  }
  const __m128i h = DT == QK_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                 : f32_to_bf16(v);
  if (count >= 8) {
    _mm_storeu_si128((__m128i*)(row + 2 * n), h);
  } else {
    uint16_t tmp[8];
    _mm_storeu_si128((__m128i*)tmp, h);
    memcpy(row + 2 * n, tmp, 2 * count);
  }
}

QK_INLINE void f32_gemm_x16c1(const size_t MR, const qk_dtype DT, size_t mr, size_t nc, size_t kc,
                              const void* const* a, const int8_t* w, const float* scale,
                              const float* bias, void* c, ptrdiff_t c_stride) {
  const char* ar[4];
  char* cr[4];
  qk_clamp_rows(MR, mr, a, c, c_stride, ar, cr);
  for (size_t n0 = 0; n0 < nc; n0 += 16, w += kc * 16) {
    __m256 acc[4][2];
    for (size_t i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int8_t* wp = w;
    for (size_t k = 0; k < kc; k++, wp += 16) {
      if ((k & 3) == 0) _mm_prefetch((const char*)wp + QK_PREFETCH_BYTES, _MM_HINT_T0);
      const __m256 w0 = i8_to_f32(wp), w1 = i8_to_f32(wp + 8);
      for (size_t i = 0; i < MR; i++) {
        const __m256 xv = bcast_x(ar[i], k, DT);
        acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
      }
    }
    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 8 * h;
      if (col >= nc) break;
      const size_t count = nc - col;
      const __m256 s = _mm256_loadu_ps(scale + col);
      const __m256 b = bias ? _mm256_loadu_ps(bias + col) : _mm256_setzero_ps();
      for (size_t i = 0; i < MR; i++) {
        __m256 v = _mm256_mul_ps(acc[i][h], s);
        if (bias) v = _mm256_add_ps(v, b);
        store_row(cr[i], col, DT, v, count);
      }
    }
  }
}

QK_DEFINE_UKERNEL_ALL_DTYPES(qk_woq_f32_gemm_ukernel_1x16c1__avx2, f32_gemm_x16c1, 1)
QK_DEFINE_UKERNEL_ALL_DTYPES(qk_woq_f32_gemm_ukernel_4x16c1__avx2, f32_gemm_x16c1, 4)
