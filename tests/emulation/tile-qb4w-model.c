/*
 * tile-qb4w-model.c -- a scalar model of the order of sums of the
 * tile_qb4w int4 kernels (include/qkern/woq.h) with tdpbf16ps summing as
 * the Intel SDM's pseudo-code does, with the signature of
 * qk_woq_int4_kblock_fn: the bits tests/woq/test_emulated.py expects of
 * them under the emulated tiles (tests/emulation/amx_on_avx2.h).
 * Portable C, for tests only.
 */
#include <math.h>
#include <string.h>

#include "qkern/woq.h"
#include "scalar-convert.h"

/* A subnormal taken as zero (of its sign), as tdpbf16ps takes its inputs
 * and results. */
static float flush(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }

/* Plane `plane` of x[row][k] in packed x (include/qkern/woq.h, "Packed
 * x"; a: the row group at the block's first chunk), as f32. */
static float packed_x(const char* a, size_t planes, size_t plane, size_t row, size_t k) {
  uint16_t bits;
  memcpy(&bits, a + (k / 32 * planes + plane) * 2048 + row * 64 + k % 32 * 2, 2);
  const uint32_t u = (uint32_t)bits << 16;
  float v;
  memcpy(&v, &u, 4);
  return flush(v);
}

void qk_test_tile_qb4w_model(size_t mr, size_t nc, size_t kc, size_t group_size, const void* a,
                             const float* xs, size_t xs_stride, qk_dtype dt, const uint8_t* w,
                             size_t w_panel_stride, const void* sz, size_t sz_stride, float* acc,
                             int first, int last, const float* bias, void* c, ptrdiff_t c_stride) {
  const size_t planes = dt == QK_F32 ? 3 : dt == QK_F16 ? 2 : 1;
  const size_t ld = (nc + 31) / 32 * 32;
  for (size_t col = 0; col < nc; col++) {
    const uint8_t* column = w + col / 32 * w_panel_stride + col % 16;
    const unsigned shift = col % 32 < 16 ? 0 : 4;
    for (size_t m = 0; m < mr; m++) {
      float sum = first ? 0.0f : acc[m * ld + col];
      for (size_t g = 0; g < kc / group_size; g++) {
        float p = 0.0f;
        for (size_t k0 = g * group_size; k0 < (g + 1) * group_size; k0 += 32)
          for (size_t plane = 0; plane < planes; plane++)
            for (size_t k = k0; k < k0 + 32; k++) { /* pairs k, k + 1 in order */
              const float q = (float)((column[k * 16] >> shift) & 15u);
              p = flush(fmaf(packed_x((const char*)a, planes, plane, m, k), q, p));
            }
        const char* pair = (const char*)sz + g * sz_stride;
        const float s = qk_load_as_f32(pair, 2 * col, dt);
        const float z = qk_load_as_f32(pair, 2 * col + 1, dt);
        sum = fmaf(p, s, sum);
        sum = fmaf(xs[m * xs_stride + g], fmaf(-8.0f, s, z), sum);
      }
      acc[m * ld + col] = sum;
      if (last)
        qk_store_from_f32((char*)c + (ptrdiff_t)m * c_stride, col, dt,
                          bias ? sum + bias[col] : sum);
    }
  }
}
