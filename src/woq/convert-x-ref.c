/*
 * convert-x-ref.c -- converts one row of activations of any dtype to f32
 * (qk_woq_convert_x_fn, include/qkern/woq.h).  Portable C, baseline flags.
 *
 * Exact: every f16 and bf16 value is an f32 value.  Reads kc elements of
 * row, writes kc floats.
 */
#include "qkern/woq_ukernels.h"
#include "scalar-convert.h"

void qk_woq_convert_x__ref(const void* row, qk_dtype dt, size_t kc, float* out) {
  for (size_t k = 0; k < kc; k++) out[k] = qk_load_as_f32(row, k, dt);
}
