/*
 * cpu_detect.c -- cpuid + XCR0 feature detection (baseline flags, no ISA
 * instructions beyond cpuid/xgetbv, which are issued as inline asm).
 */
#define _GNU_SOURCE
#include "qkern/cpu.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define XFEATURE_XTILEDATA 18
#define ARCH_REQ_XCOMP_PERM 0x1023

static unsigned long long read_xcr0(void) {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((unsigned long long)edx << 32) | eax;
}

static int request_amx_permission(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return 0;
#endif
}

void qk_cpu_detect(qk_cpu_features* f) {
  unsigned int a, b, c, d;
  memset(f, 0, sizeof(*f));
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    memcpy(f->vendor, &b, 4); /* the name is spelled in EBX, EDX, ECX */
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  const int osxsave = (c >> 27) & 1;
  const int cpu_fma = (c >> 12) & 1;
  const int cpu_f16c = (c >> 29) & 1;
  const int cpu_avx = (c >> 28) & 1;
  if (!osxsave || !cpu_avx) return;

  const unsigned long long xcr0 = read_xcr0();
  const int os_ymm = (xcr0 & 0x6) == 0x6;             /* SSE + AVX state */
  const int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM hi */
  const int os_tile = (xcr0 & 0x60000) == 0x60000;    /* XTILECFG, XTILEDATA */
  if (!os_ymm) return;
  f->fma = cpu_fma;
  f->f16c = cpu_f16c;

  unsigned int max_leaf = __get_cpuid_max(0, 0);
  if (max_leaf < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  f->avx2 = (b >> 5) & 1;
  if (os_zmm) {
    f->avx512f = (b >> 16) & 1;
    f->avx512bw = (b >> 30) & 1;
    f->avx512vl = (b >> 31) & 1;
    f->avx512_vbmi = (c >> 1) & 1;
    f->avx512_vnni = (c >> 11) & 1;
    f->avx512_fp16 = (d >> 23) & 1;
  }
  const int cpu_amx_bf16 = (d >> 22) & 1;
  const int cpu_amx_tile = (d >> 24) & 1;
  const int cpu_amx_int8 = (d >> 25) & 1;
  unsigned int a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if (os_zmm) f->avx512_bf16 = (a1 >> 5) & 1;

  if (cpu_amx_tile && os_tile && request_amx_permission()) {
    f->amx_tile = 1;
    f->amx_bf16 = cpu_amx_bf16;
    f->amx_int8 = cpu_amx_int8;
  }
}

#else /* not x86 */

void qk_cpu_detect(qk_cpu_features* f) { memset(f, 0, sizeof(*f)); }

#endif
