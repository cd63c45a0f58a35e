/*
 * ukernel-define.h -- defines an exported qk_woq_ukernel_fn from an
 * always-inline body specialised at compile time for MR and each x dtype
 * the kernel accepts (so the inner loop has no dtype branch).  Portable.
 *
 * BODY(MR, DT, mr, nc, kc, a, w, scale, bias, c, c_stride)
 */
#ifndef QKERN_UKERNEL_DEFINE_H
#define QKERN_UKERNEL_DEFINE_H

#include "qkern/woq.h"

#define QK_INLINE static inline __attribute__((always_inline))

/* How far ahead of its loads a kernel streaming packed weights prefetches
 * them (bytes): measured on a Xeon with AMX, M = 1, 4096 x 4096, cold
 * weights, the 1x32c2 AVX-512 kernel went from 7 to 10.7 GB/s on one thread
 * (DRAM read 10.8 GB/s) and from 14 to 21 GB/s on two (22 GB/s). */
#define QK_PREFETCH_BYTES 2048

/* Row pointers of x (rows of f32, as the kernels that clamp read them) and
 * y for MR rows; rows mr..MR-1 repeat row mr-1 (their results are the same
 * values, written to the same place). */
QK_INLINE void qk_clamp_rows(size_t MR, size_t mr, const void* const* a, void* c,
                             ptrdiff_t c_stride, const float** ar, char** cr) {
  for (size_t i = 0; i < MR; i++) {
    const size_t r = i < mr ? i : mr - 1;
    ar[i] = (const float*)a[r];
    cr[i] = (char*)c + (ptrdiff_t)r * c_stride;
  }
}

#define QK_UKERNEL_PARAMS                                                              \
  size_t mr, size_t nc, size_t kc, const void *const *a, qk_dtype dt, const int8_t *w, \
      const float *scale, const float *bias, void *c, ptrdiff_t c_stride

#define QK_UKERNEL_ARGS mr, nc, kc, a, w, scale, bias, c, c_stride

/* A kernel for f32, f16 and bf16 x. */
#define QK_DEFINE_UKERNEL_ALL_DTYPES(NAME, BODY, MR)           \
  void NAME(QK_UKERNEL_PARAMS) {                               \
    switch (dt) {                                              \
      case QK_F32: BODY(MR, QK_F32, QK_UKERNEL_ARGS); break;   \
      case QK_F16: BODY(MR, QK_F16, QK_UKERNEL_ARGS); break;   \
      case QK_BF16: BODY(MR, QK_BF16, QK_UKERNEL_ARGS); break; \
    }                                                          \
  }

/* switch (mr) calling ROWS(R, DT, ...) with R = mr, a compile-time
 * constant, for each mr in 1..MR (MR <= 8; mr beyond MR runs MR rows), so
 * that a body specialised for each row count spends nothing on a missing
 * row; ... are ROWS's arguments after DT. */
#define QK_ROWS_CASE(ROWS, R, MR, DT, ...) \
  case R:                                  \
    if (R < MR) {                          \
      ROWS(R, DT, __VA_ARGS__);            \
      break;                               \
    }                                      \
    __attribute__((fallthrough));
#define QK_ROWS_SWITCH(ROWS, MR, DT, ...)      \
  switch (mr) {                                \
    QK_ROWS_CASE(ROWS, 1, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 2, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 3, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 4, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 5, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 6, MR, DT, __VA_ARGS__) \
    QK_ROWS_CASE(ROWS, 7, MR, DT, __VA_ARGS__) \
    default: ROWS(MR, DT, __VA_ARGS__);        \
  }

/* A 4-row kernel for all x dtypes whose body
 * ROWS(R, DT, nc, kc, a, w, scale, bias, c, c_stride) is specialised for
 * each mr = R in 1..4: a memory-bound kernel spends no FMAs on duplicated
 * rows. */
#define QK_DEFINE_UKERNEL_ROWS_1_TO_4(NAME, ROWS)                                                 \
  QK_INLINE void NAME##_rows(const size_t MR, const qk_dtype DT, size_t mr, size_t nc, size_t kc, \
                             const void* const* a, const int8_t* w, const float* scale,           \
                             const float* bias, void* c, ptrdiff_t c_stride) {                    \
    (void)MR;                                                                                     \
    QK_ROWS_SWITCH(ROWS, 4, DT, nc, kc, a, w, scale, bias, c, c_stride)                           \
  }                                                                                               \
  QK_DEFINE_UKERNEL_ALL_DTYPES(NAME, NAME##_rows, 4)

/* A kernel for bf16 x only (the registry never hands it another dtype)
 * whose body ROWS(R, DT, nc, kc, a, w, scale, bias, c, c_stride) is
 * specialised for each mr = R in 1..MR (MR <= 8). */
#define QK_DEFINE_UKERNEL_ROWS_BF16(NAME, ROWS, MR)                           \
  void NAME(QK_UKERNEL_PARAMS) {                                              \
    (void)dt;                                                                 \
    QK_ROWS_SWITCH(ROWS, MR, QK_BF16, nc, kc, a, w, scale, bias, c, c_stride) \
  }

/* An int4 kernel (qk_woq_int4_ukernel_fn) for all x dtypes whose body
 * ROWS(R, DT, nc, kc, group_size, a, w, sz, sz_stride, bias, c, c_stride)
 * is specialised for each mr = R in 1..MR (MR <= 8). */
#define QK_INT4_ROWS_SWITCH(ROWS, MR, DT) \
  QK_ROWS_SWITCH(ROWS, MR, DT, nc, kc, group_size, a, w, sz, sz_stride, bias, c, c_stride)
#define QK_DEFINE_INT4_UKERNEL(NAME, ROWS, MR)                                                  \
  void NAME(size_t mr, size_t nc, size_t kc, size_t group_size, const float* const* a,          \
            qk_dtype dt, const uint8_t* w, const void* sz, size_t sz_stride, const float* bias, \
            void* c, ptrdiff_t c_stride) {                                                      \
    switch (dt) {                                                                               \
      case QK_F32: QK_INT4_ROWS_SWITCH(ROWS, MR, QK_F32) break;                                 \
      case QK_F16: QK_INT4_ROWS_SWITCH(ROWS, MR, QK_F16) break;                                 \
      case QK_BF16: QK_INT4_ROWS_SWITCH(ROWS, MR, QK_BF16) break;                               \
    }                                                                                           \
  }

/* QK_DEFINE_INT4_UKERNEL for bf16 x only (the registry never hands it
 * another dtype). */
#define QK_DEFINE_INT4_UKERNEL_BF16(NAME, ROWS, MR)                                             \
  void NAME(size_t mr, size_t nc, size_t kc, size_t group_size, const float* const* a,          \
            qk_dtype dt, const uint8_t* w, const void* sz, size_t sz_stride, const float* bias, \
            void* c, ptrdiff_t c_stride) {                                                      \
    (void)dt;                                                                                   \
    QK_INT4_ROWS_SWITCH(ROWS, MR, QK_BF16)                                                      \
  }

#endif /* QKERN_UKERNEL_DEFINE_H */
