/*
 * bf16-qb4w-model.c -- a scalar model of the order of sums of the
 * bf16_qb4w int4 kernels (include/qkern/woq.h), with the signature of
 * qk_woq_int4_ukernel_fn and any mr: the bits tests/woq/test_emulated.py
 * expects of them.  Portable C, for tests only.
 */
#include <math.h>

#include "qkern/woq.h"
#include "scalar-convert.h"

/* A subnormal taken as zero (of its sign), as vdpbf16ps takes its inputs
 * and results. */
static float flush(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }

void qk_test_bf16_qb4w_model(size_t mr, size_t nc, size_t kc, size_t group_size,
                             const float* const* a, qk_dtype dt, const uint8_t* w, const void* sz,
                             size_t sz_stride, const float* bias, void* c, ptrdiff_t c_stride) {
  for (size_t col = 0; col < nc; col++) {
    const uint8_t* column = w + col / 32 * kc * 16 + col % 16;
    const unsigned shift = col % 32 < 16 ? 0 : 4;
    for (size_t m = 0; m < mr; m++) {
      float acc = 0.0f;
      for (size_t g = 0; g < kc / group_size; g++) {
        float p = 0.0f;
        for (size_t k = g * group_size; k < (g + 1) * group_size; k += 2)
          for (size_t h = 2; h-- > 0;) { /* k + 1, then k: exact products */
            const float q = (float)((column[(k + h) * 16] >> shift) & 15u);
            p = flush(fmaf(flush(a[m][k + h]), q, p));
          }
        const char* pair = (const char*)sz + g * sz_stride;
        const float s = qk_load_as_f32(pair, 2 * col, dt);
        const float z = qk_load_as_f32(pair, 2 * col + 1, dt);
        acc = fmaf(p, s, acc);
        acc = fmaf(a[m][kc + g], fmaf(-8.0f, s, z), acc);
      }
      if (bias) acc = acc + bias[col];
      qk_store_from_f32((char*)c + (ptrdiff_t)m * c_stride, col, dt, acc);
    }
  }
}
