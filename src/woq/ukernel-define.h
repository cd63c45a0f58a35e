/*
 * ukernel-define.h -- defines exported micro-kernels (qk_woq_ukernel_fn,
 * qk_woq_int4_ukernel_fn) from always-inline bodies specialised at compile
 * time for each row count mr and each x dtype the kernel accepts (so the
 * inner loop has no dtype branch and spends nothing on a missing row).
 * Portable.
 */
#ifndef QKERN_UKERNEL_DEFINE_H
#define QKERN_UKERNEL_DEFINE_H

#include <xmmintrin.h>

#include "qkern/woq.h"

#define QK_INLINE static inline __attribute__((always_inline))

/* Keeps native vector v (__m256, __m512) in a register: GCC would fold a
 * load that several FMAs share into each of them, one load per FMA. */
#define QK_IN_REGISTER(v) __asm__("" : "+v"(v))

/* How far ahead of its loads a kernel streaming packed weights prefetches
 * them (bytes): measured on a Xeon with AMX, M = 1, 4096 x 4096, cold
 * weights, the 1x32c2 AVX-512 kernel went from 7 to 10.7 GB/s on one thread
 * (DRAM read 10.8 GB/s) and from 14 to 21 GB/s on two (22 GB/s). */
#define QK_PREFETCH_BYTES 2048

/* How far ahead a kernel streaming packed weights with few rows of x
 * also prefetches them into L2 (bytes): the L1 prefetch alone comes too
 * late for DRAM when little arithmetic hides the wait.  Measured on a Zen
 * 4, 4096 x 4096, cold weights, one thread: the AVX-512 kernels took
 * 0.82-0.84 of their time at M = 1 (f32 1x32c2, bf16 1x32c2) and f32
 * 0.84-0.92 at M = 2 (bf16 0.97, within noise: left out); with more rows
 * the extra prefetch gains nothing or costs (f32 0.97-1.07 at 4 rows, 1.06
 * at 6; bf16 1.03-1.22 at 4), so those kernels leave it out.  The
 * driver's int8 widenings and int4 dequantizations, which have no
 * arithmetic to hide the wait behind, take it too. */
#define QK_L2_PREFETCH_BYTES (16 * 1024)

/* The prefetches of a kernel streaming packed weights, for the line at p:
 * QK_PREFETCH_BYTES ahead into L1 and, when l2 (a compile-time constant),
 * QK_L2_PREFETCH_BYTES ahead into L2. */
QK_INLINE void qk_prefetch_stream(const void* p, int l2) {
  _mm_prefetch((const char*)p + QK_PREFETCH_BYTES, _MM_HINT_T0);
  if (l2) _mm_prefetch((const char*)p + QK_L2_PREFETCH_BYTES, _MM_HINT_T1);
}

/* How far ahead a GEMV on the unpacked weight also prefetches into L2 the
 * line it reads (bytes; into L1 it prefetches the same k of the next rows).
 * Its C rows at a time are C streams a row apart; measured on a Zen 4, M =
 * 1, 4096 x 4096 and 11008 x 4096, cold weights, one thread: without it the
 * AVX-512 GEMV took 1.4-1.6x the time of the packed 1x32c2 kernel, with it
 * 0.87-1.01x. */
#define QK_GEMV_L2_PREFETCH_BYTES (64 * 1024)

/* Bytes of one 32c2 panel of kc k values: packed int8 (WB = 1), or
 * widened to values of WB bytes (bf16 2, f32 4), its k-groups padded to a
 * multiple of 16 (include/qkern/woq.h). */
QK_INLINE size_t qk_x32c2_panel_bytes(const size_t WB, size_t kc) {
  const size_t groups = (kc + 1) / 2;
  return WB == 1 ? groups * 64 : (groups + 15) / 16 * 16 * 64 * WB;
}

/* Row pointers of x (rows of f32, as the kernels read them) and y for R
 * rows. */
QK_INLINE void qk_row_pointers(size_t R, const void* const* a, void* c, ptrdiff_t c_stride,
                               const float** ar, char** cr) {
  for (size_t i = 0; i < R; i++) {
    ar[i] = (const float*)a[i];
    cr[i] = (char*)c + (ptrdiff_t)i * c_stride;
  }
}

/* The panels of 32 columns of nc for MR rows, walked P at a time, P = 4
 * for one row, 2 for two to TWO_PANEL_ROWS rows, else 1 (so that eight or
 * more independent chains of sums hide the latency of the instruction that
 * accumulates them), then the last two and one: CALL(P, p) runs P panels
 * (a compile-time constant) from panel p. */
#define QK_X32_PANEL_STEPS(MR, TWO_PANEL_ROWS, nc, CALL)                  \
  do {                                                                    \
    const size_t qk_P = (MR) == 1 ? 4 : (MR) <= (TWO_PANEL_ROWS) ? 2 : 1; \
    const size_t qk_panels = ((nc) + 31) / 32;                            \
    size_t qk_p = 0;                                                      \
    for (; qk_p + qk_P <= qk_panels; qk_p += qk_P) CALL(qk_P, qk_p);      \
    if (qk_P == 4 && qk_p + 2 <= qk_panels) {                             \
      CALL(2, qk_p);                                                      \
      qk_p += 2;                                                          \
    }                                                                     \
    if (qk_p < qk_panels) CALL(1, qk_p);                                  \
  } while (0)

#define QK_UKERNEL_PARAMS                                                              \
  size_t mr, size_t nc, size_t kc, const void *const *a, qk_dtype dt, const int8_t *w, \
      const float *scale, const float *bias, void *c, ptrdiff_t c_stride

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

/* switch (dt) calling CALL(..., DT) with DT, a compile-time constant, for
 * each x dtype. */
#define QK_DTYPE_SWITCH(CALL, ...)                   \
  switch (dt) {                                      \
    case QK_F32: CALL(__VA_ARGS__, QK_F32); break;   \
    case QK_F16: CALL(__VA_ARGS__, QK_F16); break;   \
    case QK_BF16: CALL(__VA_ARGS__, QK_BF16); break; \
  }

/* An MR-row kernel (qk_woq_ukernel_fn) for all x dtypes whose body
 * ROWS(R, DT, nc, kc, a, w, scale, bias, c, c_stride) is specialised for
 * each mr = R in 1..MR (MR <= 8). */
#define QK_UKERNEL_ROWS_SWITCH(ROWS, MR, DT) \
  QK_ROWS_SWITCH(ROWS, MR, DT, nc, kc, a, w, scale, bias, c, c_stride)
#define QK_DEFINE_UKERNEL_ROWS(NAME, ROWS, MR) \
  void NAME(QK_UKERNEL_PARAMS) { QK_DTYPE_SWITCH(QK_UKERNEL_ROWS_SWITCH, ROWS, MR) }

/* QK_DEFINE_UKERNEL_ROWS for bf16 x only (the registry never hands it
 * another dtype). */
#define QK_DEFINE_UKERNEL_ROWS_BF16(NAME, ROWS, MR) \
  void NAME(QK_UKERNEL_PARAMS) {                    \
    (void)dt;                                       \
    QK_UKERNEL_ROWS_SWITCH(ROWS, MR, QK_BF16)       \
  }

/* An int4 kernel (qk_woq_int4_ukernel_fn) for all x dtypes whose body
 * ROWS(R, DT, nc, kc, group_size, a, w, sz, sz_stride, bias, c, c_stride)
 * is specialised for each mr = R in 1..MR (MR <= 8). */
#define QK_INT4_UKERNEL_PARAMS                                                            \
  size_t mr, size_t nc, size_t kc, size_t group_size, const float *const *a, qk_dtype dt, \
      const uint8_t *w, const void *sz, size_t sz_stride, const float *bias, void *c,     \
      ptrdiff_t c_stride
#define QK_INT4_ROWS_SWITCH(ROWS, MR, DT) \
  QK_ROWS_SWITCH(ROWS, MR, DT, nc, kc, group_size, a, w, sz, sz_stride, bias, c, c_stride)
#define QK_DEFINE_INT4_UKERNEL(NAME, ROWS, MR) \
  void NAME(QK_INT4_UKERNEL_PARAMS) { QK_DTYPE_SWITCH(QK_INT4_ROWS_SWITCH, ROWS, MR) }

/* QK_DEFINE_INT4_UKERNEL for bf16 x only (the registry never hands it
 * another dtype). */
#define QK_DEFINE_INT4_UKERNEL_BF16(NAME, ROWS, MR) \
  void NAME(QK_INT4_UKERNEL_PARAMS) {               \
    (void)dt;                                       \
    QK_INT4_ROWS_SWITCH(ROWS, MR, QK_BF16)          \
  }

#endif /* QKERN_UKERNEL_DEFINE_H */
