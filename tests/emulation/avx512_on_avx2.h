/*
 * avx512_on_avx2.h -- AVX-512 intrinsics on an AVX2 CPU, for tests only.
 * Force-included (-include) before an AVX-512 kernel source compiled with
 * -mavx2 -mfma -mf16c instead of its AVX-512 flags, it maps every
 * _mm512_* and masked intrinsic to SIMDe's implementation (on 256-bit
 * halves), and defines those the kernels use that SIMDe lacks, and the
 * FMAs lane by lane with fmaf (fused, as the hardware computes them,
 * whatever path SIMDe's build takes) and the masked loads and
 * stores (only the mask's lanes touched, as on the hardware).  The kernel's own
 * #include <immintrin.h> then adds nothing.  tests/woq/test_emulated.py
 * builds kernels with it.
 */
#ifndef QKERN_TESTS_AVX512_ON_AVX2_H
#define QKERN_TESTS_AVX512_ON_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

/* LANES integers of type IN -> LANES of type OUT in a 512-bit vector,
 * sign- or zero-extended as IN is signed or not (vpmovsx / vpmovzx). */
#define QK_EMU_EXTEND(NAME, VEC_IN, IN, OUT, LANES) \
  static inline simde__m512i NAME(VEC_IN a) {       \
    IN in[LANES];                                   \
    OUT out[LANES];                                 \
    memcpy(in, &a, sizeof(in));                     \
    for (int i = 0; i < LANES; i++) out[i] = in[i]; \
    return simde_mm512_loadu_si512(out);            \
  }
QK_EMU_EXTEND(qk_emu_cvtepi8_epi32, simde__m128i, int8_t, int32_t, 16)
QK_EMU_EXTEND(qk_emu_cvtepu8_epi32, simde__m128i, uint8_t, int32_t, 16)
QK_EMU_EXTEND(qk_emu_cvtepu8_epi16, simde__m256i, uint8_t, int16_t, 32)

/* 16 int32 -> 16 int16, truncated (vpmovdw). */
static inline simde__m256i qk_emu_cvtepi32_epi16(simde__m512i a) {
  int32_t in[16];
  int16_t out[16];
  simde_mm512_storeu_si512(in, a);
  for (int i = 0; i < 16; i++) out[i] = (int16_t)in[i];
  return simde_mm256_loadu_si256(out);
}

/* 16 f32 -> 16 f16 with the rounding of imm (vcvtps2ph), by halves. */
#define qk_emu_cvtps_ph(a, imm)                                                         \
  simde_mm256_set_m128i(simde_mm256_cvtps_ph(simde_mm512_extractf32x8_ps((a), 1), imm), \
                        simde_mm256_cvtps_ph(simde_mm512_extractf32x8_ps((a), 0), imm))

/* a * b + c (or -(a * b) + c), fused (one rounding), lane by lane:
 * whatever path SIMDe's build takes (its portable one multiplies, then
 * adds). */
static inline simde__m512 qk_emu_fma(simde__m512 a, simde__m512 b, simde__m512 c, int negate) {
  float x[16], y[16], z[16];
  simde_mm512_storeu_ps(x, a);
  simde_mm512_storeu_ps(y, b);
  simde_mm512_storeu_ps(z, c);
  for (int i = 0; i < 16; i++) x[i] = fmaf(negate ? -x[i] : x[i], y[i], z[i]);
  return simde_mm512_loadu_ps(x);
}

/* Masked loads and stores that touch only the lanes of their mask, as the
 * hardware does (SIMDe's read or write the whole vector): lane by lane,
 * with zeros in the lanes a load skips. */
#define QK_EMU_MASKED_LOAD(NAME, VEC, LANES, SIZE, MASK, LOADU)                    \
  static inline VEC NAME(MASK k, const void* p) {                                  \
    unsigned char lanes[LANES * SIZE] = {0};                                       \
    for (int i = 0; i < LANES; i++)                                                \
      if ((k >> i) & 1) memcpy(lanes + i * SIZE, (const char*)p + i * SIZE, SIZE); \
    return LOADU((const void*)lanes);                                              \
  }
#define QK_EMU_MASKED_STORE(NAME, VEC, LANES, SIZE, MASK, STOREU)            \
  static inline void NAME(void* p, MASK k, VEC v) {                          \
    unsigned char lanes[LANES * SIZE];                                       \
    STOREU((void*)lanes, v);                                                 \
    for (int i = 0; i < LANES; i++)                                          \
      if ((k >> i) & 1) memcpy((char*)p + i * SIZE, lanes + i * SIZE, SIZE); \
  }
QK_EMU_MASKED_LOAD(qk_emu_maskz_loadu_ps, simde__m512, 16, 4, simde__mmask16, simde_mm512_loadu_ps)
QK_EMU_MASKED_LOAD(qk_emu_maskz_loadu_epi16, simde__m512i, 32, 2, simde__mmask32,
                   simde_mm512_loadu_si512)
QK_EMU_MASKED_LOAD(qk_emu_maskz_loadu_epi16_256, simde__m256i, 16, 2, simde__mmask16,
                   simde_mm256_loadu_si256)
QK_EMU_MASKED_LOAD(qk_emu_maskz_loadu_epi8_128, simde__m128i, 16, 1, simde__mmask16,
                   simde_mm_loadu_si128)
QK_EMU_MASKED_STORE(qk_emu_mask_storeu_ps, simde__m512, 16, 4, simde__mmask16,
                    simde_mm512_storeu_ps)
QK_EMU_MASKED_STORE(qk_emu_mask_storeu_epi16_256, simde__m256i, 16, 2, simde__mmask16,
                    simde_mm256_storeu_si256)

#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, p) qk_emu_maskz_loadu_ps(k, p)
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16(k, p) qk_emu_maskz_loadu_epi16(k, p)
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16(k, p) qk_emu_maskz_loadu_epi16_256(k, p)
#undef _mm_maskz_loadu_epi8
#define _mm_maskz_loadu_epi8(k, p) qk_emu_maskz_loadu_epi8_128(k, p)
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(p, k, v) qk_emu_mask_storeu_ps(p, k, v)
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16(p, k, v) qk_emu_mask_storeu_epi16_256(p, k, v)
/* The sum of the 16 lanes in the order of GCC's _mm512_reduce_add_ps:
 * halves, then quarters, then pairs. */
static inline float qk_emu_reduce_add_ps(simde__m512 a) {
  float v[16], h[8], q[4];
  simde_mm512_storeu_ps(v, a);
  for (int i = 0; i < 8; i++) h[i] = v[8 + i] + v[i];
  for (int i = 0; i < 4; i++) q[i] = h[4 + i] + h[i];
  const float p0 = q[0] + q[2], p1 = q[1] + q[3];
  return p0 + p1;
}

/* vdpbf16ps as the Intel SDM defines it, lane by lane: src += a.hi * b.hi,
 * then src += a.lo * b.lo (bf16 pairs of the lane; each product exact in
 * fp32, each add rounded to nearest even whatever MXCSR says), inputs
 * (src and the bf16 values) that are subnormal taken as zero and
 * subnormal results flushed to zero (SIMDe's portable version sums the
 * two products in another order). */
static inline float qk_emu_daz(float v) {
  return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v;
}
static inline float qk_emu_bf16(uint16_t bits) {
  const uint32_t u = (uint32_t)bits << 16;
  float v;
  memcpy(&v, &u, 4);
  return qk_emu_daz(v);
}
static inline simde__m512 qk_emu_dpbf16_ps(simde__m512 src, simde__m512bh a, simde__m512bh b) {
  float acc[16];
  uint16_t x[32], y[32];
  simde_mm512_storeu_ps(acc, src);
  memcpy(x, &a, 64);
  memcpy(y, &b, 64);
  for (int i = 0; i < 16; i++) {
    float r = qk_emu_daz(acc[i]);
    for (int h = 1; h >= 0; h--)
      r = qk_emu_daz(fmaf(qk_emu_bf16(x[2 * i + h]), qk_emu_bf16(y[2 * i + h]), r));
    acc[i] = r;
  }
  return simde_mm512_loadu_ps(acc);
}

/* vcvtne2ps2bf16: the 32 bf16 of b's 16 lanes, then a's, each rounded to
 * nearest even (NaN quiet) with subnormal inputs and results taken as
 * zero (SIMDe has no version). */
static inline uint16_t qk_emu_to_bf16(float v) {
  uint32_t u;
  v = qk_emu_daz(v);
  memcpy(&u, &v, 4);
  if (isnan(v)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  uint16_t h = (uint16_t)(u >> 16);
  if ((h & 0x7f80) == 0) h &= 0x8000; /* a subnormal result */
  return h;
}
static inline simde__m512bh qk_emu_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
  float lanes[32];
  uint16_t out[32];
  simde__m512bh r;
  simde_mm512_storeu_ps(lanes, b);
  simde_mm512_storeu_ps(lanes + 16, a);
  for (int i = 0; i < 32; i++) out[i] = qk_emu_to_bf16(lanes[i]);
  memcpy(&r, out, 64);
  return r;
}

#undef _mm512_cvtne2ps_pbh
#define _mm512_cvtne2ps_pbh(a, b) qk_emu_cvtne2ps_pbh(a, b)
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps(src, a, b) qk_emu_dpbf16_ps(src, a, b)
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps(a) qk_emu_reduce_add_ps(a)
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps(a, b, c) qk_emu_fma(a, b, c, 0)
#undef _mm512_fnmadd_ps
#define _mm512_fnmadd_ps(a, b, c) qk_emu_fma(a, b, c, 1)
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32(a) qk_emu_cvtepi8_epi32(a)
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32(a) qk_emu_cvtepu8_epi32(a)
#undef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi16(a) qk_emu_cvtepu8_epi16(a)
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16(a) qk_emu_cvtepi32_epi16(a)
#undef _mm512_cvtps_ph
#define _mm512_cvtps_ph(a, imm) qk_emu_cvtps_ph(a, imm)

#endif /* QKERN_TESTS_AVX512_ON_AVX2_H */
