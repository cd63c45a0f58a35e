/*
 * f32-qb4w-gemm-ref.c -- the portable reference kernel on int4 groupwise
 * weights ("qb4w": 4-bit, blockwise scales), compiled at baseline flags.
 *
 * Contract: qk_woq_int4_ukernel_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), in the order of the sums the header fixes for every
 * int4 kernel, compute f32_qb4w: per group, p = fma chain of x[k] * q[k]
 * from 0 in increasing k for a low nibble (columns 0..15 of a panel), and
 * for a high nibble p = (pb - plo) * 2^-4, pb the fma chain of x[k] times
 * the whole byte, plo the low nibble's p; then acc = fma(p, s, acc),
 * acc = fma(xs, z', acc) with
 * z' = fma(-8, s, z) and xs the driver's group sum; y = acc (+ bias), one
 * rounding to dt.  Rows of x arrive in f32 with their group sums.
 */
#include <assert.h>
#include <math.h>

#include "qkern/woq_ukernels.h"
#include "scalar-convert.h"

/* The group's p of column j (0..31) of a panel for row x, k from k0 to
 * k1 - 1. */
static float group_sum(const uint8_t* panel, size_t j, const float* x, size_t k0, size_t k1) {
  float low = 0.0f, bytes = 0.0f; /* the chains of the low nibbles, of the bytes */
  for (size_t k = k0; k < k1; k++) {
    const uint8_t byte = panel[k * 16 + j % 16];
    low = fmaf(x[k], (float)(byte & 15u), low);
    if (j >= 16) bytes = fmaf(x[k], (float)byte, bytes);
  }
  return j < 16 ? low : (bytes - low) * 0.0625f;
}

static void f32_qb4w_gemm_ref(size_t MR, size_t mr, size_t nc, size_t kc, size_t group_size,
                              const float* const* a, qk_dtype dt, const uint8_t* w, const void* sz,
                              size_t sz_stride, const float* bias, void* c, ptrdiff_t c_stride) {
  assert(mr >= 1 && mr <= MR && nc >= 1 && group_size > 0 && kc % group_size == 0);
  (void)MR;
  const size_t groups = kc / group_size;
  for (size_t col = 0; col < nc; col++) {
    const uint8_t* panel = w + col / 32 * kc * 16;
    for (size_t m = 0; m < mr; m++) {
      float acc = 0.0f;
      for (size_t g = 0; g < groups; g++) {
        const float p = group_sum(panel, col % 32, a[m], g * group_size, (g + 1) * group_size);
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

void qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref(size_t mr, size_t nc, size_t kc, size_t group_size,
                                              const float* const* a, qk_dtype dt, const uint8_t* w,
                                              const void* sz, size_t sz_stride, const float* bias,
                                              void* c, ptrdiff_t c_stride) {
  f32_qb4w_gemm_ref(4, mr, nc, kc, group_size, a, dt, w, sz, sz_stride, bias, c, c_stride);
}
