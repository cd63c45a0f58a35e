"""CPU feature detection (thin wrapper over src/cpu/cpu_detect.c)."""
from qkern._clib cimport qk_cpu_detect, qk_cpu_features


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
        "avx512_fp16": bool(f.avx512_fp16),
        "avx512_vnni": bool(f.avx512_vnni),
        "amx_tile": bool(f.amx_tile),
        "amx_bf16": bool(f.amx_bf16),
        "amx_int8": bool(f.amx_int8),
    }
