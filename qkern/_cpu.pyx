"""CPU feature detection and thread limits (thin wrappers over src/cpu/)."""
from qkern._clib cimport (QK_THREADS_FORKED, QK_THREADS_OS_REFUSED, qk_cpu_detect, qk_cpu_features,
                          qk_threads_for_call, qk_threads_take_notice)


def detect():
    """Run cpuid/XCR0 detection (and the AMX permission request) once.

    Returns
    -------
    dict
        Feature name -> bool, as documented for :func:`qkern.cpu_features`.
    """
    cdef qk_cpu_features f
    qk_cpu_detect(&f)
    return {
        "avx2": bool(f.avx2),
        "fma": bool(f.fma),
        "f16c": bool(f.f16c),
        "avx512f": bool(f.avx512f),
        "avx512bw": bool(f.avx512bw),
        "avx512vl": bool(f.avx512vl),
        "avx512_bf16": bool(f.avx512_bf16),
        "avx512_vbmi": bool(f.avx512_vbmi),
        "avx512_fp16": bool(f.avx512_fp16),
        "avx512_vnni": bool(f.avx512_vnni),
        "amx_tile": bool(f.amx_tile),
        "amx_bf16": bool(f.amx_bf16),
        "amx_int8": bool(f.amx_int8),
    }


def vendor():
    """The CPU's vendor as cpuid spells it.

    Returns
    -------
    str
        ``"GenuineIntel"``, ``"AuthenticAMD"``, ...; ``""`` where cpuid is
        absent.
    """
    cdef qk_cpu_features f
    qk_cpu_detect(&f)
    return f.vendor.decode("ascii", "replace")


def threads_for_call(int requested):
    """Threads a call asking for ``requested`` (<= 0: the OpenMP default) may
    start: capped at the processors, 1 in a forked child, no more than the OS
    can start (include/qkern/threads.h)."""
    cdef int threads
    with nogil:
        threads = qk_threads_for_call(requested)
    return threads


def take_thread_notice():
    """Notices left by the thread limits since the last call, each once per
    process: a set of ``"forked"`` and ``"os_refused"``."""
    cdef int bits = qk_threads_take_notice()
    return {name for name, bit in (("forked", QK_THREADS_FORKED),
                                   ("os_refused", QK_THREADS_OS_REFUSED)) if bits & bit}
