/*
 * qkern/cpu.h -- CPU feature detection.
 *
 * qk_cpu_detect() reads cpuid and XCR0 once; an ISA is reported only when the
 * CPU has it *and* the OS saves its register state (XCR0).  AMX is reported
 * only after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded,
 * which is also what allows this process to execute tile instructions.
 * vendor is cpuid leaf 0's twelve characters ("GenuineIntel",
 * "AuthenticAMD"), empty where cpuid is absent.
 */
#ifndef QKERN_CPU_H
#define QKERN_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qk_cpu_features {
  int avx2;
  int fma;
  int f16c;
  int avx512f;
  int avx512bw;
  int avx512vl;
  int avx512_bf16;
  int avx512_vbmi;
  int avx512_fp16;
  int avx512_vnni;
  int amx_tile;
  int amx_bf16;
  int amx_int8;
  char vendor[13];
} qk_cpu_features;

/* Fills *out.  Safe to call more than once; the AMX permission request is
 * idempotent. */
void qk_cpu_detect(qk_cpu_features* out);

#ifdef __cplusplus
}
#endif

#endif /* QKERN_CPU_H */
