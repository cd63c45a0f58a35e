/*
 * io-avx512.h -- AVX-512 (F/BW/VL, F16C) helpers shared by the AVX-512 WoQ
 * kernels: int8 weight widening and row stores in the output dtype.
 * Include only from files compiled with the AVX-512 flags.
 */
#ifndef QKERN_IO_AVX512_H
#define QKERN_IO_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "sanitize.h"
#include "scalar-convert.h"
#include "ukernel-define.h"

/* QK_IN_REGISTER for an __m512; nothing where __m512 is not a native
 * vector (the tests' emulation on AVX2). */
#ifdef __AVX512F__
#define QK512_IN_REGISTER(v) QK_IN_REGISTER(v)
#else
#define QK512_IN_REGISTER(v) (void)(v)
#endif

/* The float at p in every lane, broadcast as its 32 bits: on a Zen 4 the
 * integer broadcast from memory (vpbroadcastd) runs beside the FMAs, where
 * vbroadcastss, what _mm512_set1_ps of a loaded float compiles to, takes a
 * slot of the permutation ports, one of which the FMAs share. */
QK_INLINE __m512 qk512_broadcast(const float* p) {
  int32_t bits;
  memcpy(&bits, p, sizeof bits);
  return _mm512_castsi512_ps(_mm512_set1_epi32(bits));
}

/* 16 int8 in q -> 16 f32 (exact). */
QK_INLINE __m512 qk512_i8x16_to_f32(__m128i q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

/* 16 int8 at p -> 16 f32 (exact). */
QK_INLINE __m512 qk512_i8_to_f32(const int8_t* p) {
  return qk512_i8x16_to_f32(_mm_loadu_si128((const __m128i*)p));
}

/* Word indices of the high halves of the 32 f32 lanes of two vectors. */
static const uint16_t qk512_high_halves[32]
    __attribute__((aligned(64))) = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

/* The high halves of the f32 in lo then hi: 32 bf16 in order, exact when
 * each f32 holds a bf16 value (an integer |w| <= 128 has at most 8
 * significant bits).  idx is _mm512_load_si512(qk512_high_halves). */
QK_INLINE __m512i qk512_high_halves_of(__m512 lo, __m512 hi, __m512i idx) {
  return _mm512_permutex2var_epi16(_mm512_castps_si512(lo), idx, _mm512_castps_si512(hi));
}

/* 32 int8 at p -> 32 bf16 in order (qk512_high_halves_of). */
QK_INLINE __m512i qk512_i8_to_bf16(const int8_t* p, __m512i idx) {
  return qk512_high_halves_of(qk512_i8_to_f32(p), qk512_i8_to_f32(p + 16), idx);
}

/* The same for the int8 at p that mask selects, zero elsewhere (nothing
 * read there). */
QK_INLINE __m512i qk512_i8_to_bf16_masked(const int8_t* p, __mmask32 mask, __m512i idx) {
  const __m128i lo = _mm_maskz_loadu_epi8((__mmask16)mask, p);
  const __m128i hi = _mm_maskz_loadu_epi8((__mmask16)(mask >> 16), p + 16);
  return qk512_high_halves_of(qk512_i8x16_to_f32(lo), qk512_i8x16_to_f32(hi), idx);
}

/* One k-group of a packed x32c2 panel, 64 int8 at src, -> its 64 values in
 * the same order at dst as values of WB bytes (2: bf16, 4: f32), exact;
 * prefetches the weight as qk_prefetch_stream(src, l2) does.  idx is
 * _mm512_load_si512(qk512_high_halves). */
QK_INLINE void qk512_widen_group(const size_t WB, const int8_t* src, __m512i idx, char* dst,
                                 int l2) {
  qk_prefetch_stream(src, l2);
  if (WB == 2) {
    _mm512_storeu_si512(dst, qk512_i8_to_bf16(src, idx));
    _mm512_storeu_si512(dst + 64, qk512_i8_to_bf16(src + 32, idx));
  } else {
    for (size_t run = 0; run < 4; run++)
      _mm512_storeu_ps(dst + 64 * run, qk512_i8_to_f32(src + 16 * run));
  }
}

/* Zeroes `lines` 64-byte lines at dst. */
QK_INLINE void qk512_zero_lines(char* dst, size_t lines) {
  for (size_t line = 0; line < lines; line++, dst += 64)
    _mm512_storeu_si512(dst, _mm512_setzero_si512());
}

/* Lanes of mask for the first `count` of 16 columns. */
QK_INLINE __mmask16 qk512_mask(size_t count) {
  return count >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1u);
}

/* The same for the first `count` of 32 lanes (bytes or words). */
QK_INLINE __mmask32 qk512_mask32(size_t count) {
  return count >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << count) - 1;
}

/* f32 -> bf16 bits (round to nearest even, NaN kept quiet), in 16-bit lanes. */
QK_INLINE __m256i qk512_f32_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* Lanes 0 .. the highest lane selected by mask. */
QK_INLINE size_t qk512_mask_span(__mmask16 mask) {
  return mask ? 32 - (size_t)__builtin_clz((unsigned)mask) : 0;
}

/* Stores the lanes of v selected by mask at element n of a dtype-DT row. */
QK_INLINE void qk512_store(char* row, size_t n, qk_dtype DT, __m512 v, __mmask16 mask) {
  const size_t esize = qk_dtype_size(DT);
  char* const at = row + esize * n;
  QK_ASAN_CHECK(at, esize * qk512_mask_span(mask), 1);
  switch (DT) {
    case QK_F32: _mm512_mask_storeu_ps(at, mask, v); break;
    case QK_F16:
      _mm256_mask_storeu_epi16(at, mask,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case QK_BF16: _mm256_mask_storeu_epi16(at, mask, qk512_f32_to_bf16(v)); break;
  }
}

/* Epilogue of 16 columns from col: acc * scale (+ bias), one rounding to DT,
 * the mask's lanes stored at element col of row. */
QK_INLINE void qk512_epilogue(char* row, size_t col, qk_dtype DT, __m512 acc, __m512 s, __m512 b,
                              int has_bias, __mmask16 mask) {
  __m512 v = _mm512_mul_ps(acc, s);
  if (has_bias) v = _mm512_add_ps(v, b);
  qk512_store(row, col, DT, v, mask);
}

#endif /* QKERN_IO_AVX512_H */
