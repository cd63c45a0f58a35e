/*
 * qkern/fpenv.h -- the floating-point environment every kernel runs under.
 *
 * The results documented in docs/semantics.rst assume IEEE 754 arithmetic
 * with gradual underflow: MXCSR = 0x1F80 (round to nearest even, FTZ and
 * DAZ off, every exception masked).  A caller may have set something else
 * (flush-to-zero, denormals-are-zero: torch.set_flush_denormal(True), code
 * built with -ffast-math), and OpenMP worker threads keep whatever MXCSR
 * they were created with, so the caller's setting would reach some columns
 * of a result and not others.  Each thread that runs a kernel therefore
 * enters this environment first and restores its own MXCSR, exactly (status
 * flags included), when it leaves.  Instructions that ignore MXCSR
 * (vdpbf16ps, tdpbf16ps) are described in docs/semantics.rst.
 *
 * SSE is part of baseline x86-64; elsewhere these do nothing.
 */
#ifndef QKERN_FPENV_H
#define QKERN_FPENV_H

#if defined(__SSE__)
#include <xmmintrin.h>

#define QK_MXCSR_DEFAULT 0x1F80u

typedef unsigned int qk_fpenv;

/* Saves the calling thread's MXCSR and sets the kernels' environment. */
static inline qk_fpenv qk_fpenv_enter(void) {
  const qk_fpenv saved = _mm_getcsr();
  _mm_setcsr(QK_MXCSR_DEFAULT);
  return saved;
}

/* Restores the MXCSR saved by qk_fpenv_enter(). */
static inline void qk_fpenv_leave(qk_fpenv saved) { _mm_setcsr(saved); }

#else
typedef int qk_fpenv;
static inline qk_fpenv qk_fpenv_enter(void) { return 0; }
static inline void qk_fpenv_leave(qk_fpenv saved) { (void)saved; }
#endif

#endif /* QKERN_FPENV_H */
