/*
 * f32-gemm-ref.c -- portable reference micro-kernels, one per packed layout
 * that a SIMD kernel uses, compiled at baseline flags.
 *
 * Contract (include/qkern/woq.h, qk_woq_ukernel_fn): for m < mr, n < nc
 *   c[m][n] = dt( (sum_k f32(a[m][k]) * w[n, k]) * scale[n] (+ bias[n]) )
 * accumulated in f32 in increasing k, scale applied with a multiply and the
 * bias with a separate add, one rounding to dt at the store.
 * Preconditions: 1 <= mr <= MR, nc >= 1, scale (and bias) hold roundup(nc, NR)
 * floats, w holds roundup(nc, NR) / NR panels of roundup(kc, KR) * NR bytes.
 */
#include <assert.h>

#include "qkern/woq.h"
#include "scalar-convert.h"

static void f32_gemm_ref(size_t MR, size_t NR, size_t KR, size_t mr, size_t nc, size_t kc,
                         const void* const* a, qk_dtype dt, const int8_t* w, const float* scale,
                         const float* bias, void* c, ptrdiff_t c_stride) {
  assert(mr >= 1 && mr <= MR && nc >= 1);
  (void)MR;
  KR = qk_woq_group_len(kc, (uint32_t)KR); /* KR = 0: all of K, row-major w */
  const size_t kp = (kc + KR - 1) / KR * KR;
  for (size_t n0 = 0; n0 < nc; n0 += NR) {
    const int8_t* panel = w + (n0 / NR) * kp * NR;
    const size_t nb = nc - n0 < NR ? nc - n0 : NR;
    for (size_t m = 0; m < mr; m++) {
      char* crow = (char*)c + (ptrdiff_t)m * c_stride;
      for (size_t j = 0; j < nb; j++) {
        float acc = 0.0f;
        for (size_t k = 0; k < kc; k++) {
          const int8_t wv = panel[(k / KR) * NR * KR + j * KR + k % KR];
          acc += qk_load_as_f32(a[m], k, dt) * (float)wv;
        }
        float v = acc * scale[n0 + j];
        if (bias) v = v + bias[n0 + j];
        qk_store_from_f32(crow, n0 + j, dt, v);
      }
    }
  }
}

#define QK_DEFINE_REF(MR, NR, KR)                                                          \
  void qk_woq_f32_gemm_ukernel_##MR##x##NR##c##KR##__ref(                                  \
      size_t mr, size_t nc, size_t kc, const void* const* a, qk_dtype dt, const int8_t* w, \
      const float* scale, const float* bias, void* c, ptrdiff_t c_stride) {                \
    f32_gemm_ref(MR, NR, KR, mr, nc, kc, a, dt, w, scale, bias, c, c_stride);              \
  }

QK_DEFINE_REF(4, 16, 1)
QK_DEFINE_REF(4, 32, 2)
QK_DEFINE_REF(4, 1, 0)
