/*
 * scalar-convert.h -- portable scalar conversions between f32 and the
 * 16-bit element types (no ISA instructions; compiled at any flags).
 *
 * f32 -> bf16 and f32 -> f16 round to nearest, ties to even; NaN stays NaN
 * (quiet), infinities and signed zeros are kept, overflow gives infinity.
 */
#ifndef QKERN_SCALAR_CONVERT_H
#define QKERN_SCALAR_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "qkern/woq.h"

static inline float qk_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t qk_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float qk_f16_to_f32(uint16_t h) {
  _Float16 v;
  memcpy(&v, &h, 2);
  return (float)v;
}

static inline uint16_t qk_f32_to_f16(float f) {
  _Float16 v = (_Float16)f;
  uint16_t h;
  memcpy(&h, &v, 2);
  return h;
}

/* Element k of a row of dtype dt, as f32 (exact for every dtype).  Rows
 * need not be aligned to their element size (NumPy allows unaligned arrays),
 * so elements are read and written with memcpy, never through a typed
 * pointer; memcpy of 2 or 4 bytes compiles to one move. */
static inline float qk_load_as_f32(const void* row, size_t k, qk_dtype dt) {
  if (dt == QK_F32) {
    float f;
    memcpy(&f, (const char*)row + 4 * k, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char*)row + 2 * k, 2);
  return dt == QK_F16 ? qk_f16_to_f32(h) : qk_bf16_to_f32(h);
}

/* Stores f32 v as element n of a row of dtype dt (one rounding). */
static inline void qk_store_from_f32(void* row, size_t n, qk_dtype dt, float v) {
  if (dt == QK_F32) {
    memcpy((char*)row + 4 * n, &v, 4);
    return;
  }
  const uint16_t h = dt == QK_F16 ? qk_f32_to_f16(v) : qk_f32_to_bf16(v);
  memcpy((char*)row + 2 * n, &h, 2);
}

#endif /* QKERN_SCALAR_CONVERT_H */
