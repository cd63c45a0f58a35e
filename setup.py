"""Build qkern: one static library per ISA, then the Cython extensions.

Each ISA's kernels are compiled with that ISA's flags only; everything else
(drivers, packing, registry, reference kernels, CPU detection) is compiled
at baseline x86-64 flags, so one build runs on any x86-64 CPU and chooses its
kernels at run time.  The compiler is probed for each ISA; an ISA it cannot
build is left out of the registry (QKERN_HAVE_<ISA> undefined), never a
build failure.
"""

import glob
import os
import tempfile

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools._distutils.ccompiler import new_compiler
from setuptools._distutils.errors import CompileError
from setuptools._distutils.sysconfig import customize_compiler

# QKERN_SANITIZE=1 builds every library and extension with AddressSanitizer
# and UndefinedBehaviorSanitizer (any UB report aborts), under build/sanitize
# so that it never mixes with the normal build (docs/reliability.rst).
SANITIZE = os.environ.get("QKERN_SANITIZE", "") not in ("", "0")
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g"] if SANITIZE else []

# -ffp-contract=off: scale (multiply) and bias (add) stay two roundings, as
# specified, in every kernel and at every MR.
COMMON_CFLAGS = ["-O3", "-std=gnu11", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off",
                 "-Wall"] + SANITIZE_FLAGS
INCLUDE = ["include"]
# Kernels and their loops start on a cache line, so that a change to other
# code cannot move them: on a Zen 3 the AVX2 kernel ran 3-4 % slower when a
# driver change shifted it by 48 bytes, and aligned it runs as fast as the
# best placement measured.
KERNEL_CFLAGS = ["-falign-functions=64", "-falign-loops=64"]

# (library, macro, flags, probe statement, sources)
ISA_LIBRARIES = [
    (
        "qkern_avx2",
        "QKERN_HAVE_AVX2",
        ["-mavx2", "-mfma", "-mf16c"],
        "__m256 v = _mm256_fmadd_ps(_mm256_set1_ps(1.f), _mm256_set1_ps(2.f), "
        "_mm256_setzero_ps()); (void)v;",
        ["src/woq/f32-gemm-x16c1-avx2.c", "src/woq/f32-gemv-x1c0-avx2.c",
         "src/woq/f32-qb4w-gemm-x32c1-avx2.c", "src/woq/convert-x-avx2.c",
         "src/woq/widen-x16c1-avx2.c", "src/woq/dequant-x32c1-avx2.c",
         "src/woq/f32dq-qb4w-gemm-x32c1-avx2.c",
         "src/roofline/peak-vfmadd231ps-avx2.c"],
    ),
    (
        "qkern_avx512",
        "QKERN_HAVE_AVX512",
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c"],
        "__m256i h = _mm512_cvtepi32_epi16(_mm512_set1_epi32(1)); (void)h;",
        ["src/woq/f32-gemm-x32c2-avx512.c", "src/woq/f32-gemv-x1c0-avx512.c",
         "src/woq/f32-qb4w-gemm-x32c1-avx512.c", "src/woq/f32dq-qb4w-gemm-x32c1-avx512.c",
         "src/woq/dequant-x32c1-avx512.c", "src/woq/widen-x32c2-avx512.c",
         "src/woq/pack-x-avx512.c", "src/woq/widen-x32c1-avx512.c",
         "src/roofline/peak-vfmadd231ps-avx512.c"],
    ),
    (
        "qkern_avx512bf16",
        "QKERN_HAVE_AVX512_BF16",
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c", "-mavx512bf16",
         "-mavx512vbmi"],
        "__m512bh z = _mm512_cvtne2ps_pbh(_mm512_setzero_ps(), _mm512_setzero_ps()); "
        "__m512 v = _mm512_dpbf16_ps(_mm512_setzero_ps(), z, z); (void)v; "
        "__m512i b = _mm512_permutexvar_epi8(_mm512_setzero_si512(), _mm512_setzero_si512()); "
        "(void)b;",
        ["src/woq/bf16-gemm-x32c2-avx512bf16.c", "src/woq/bf16-gemv-x1c0-avx512bf16.c",
         "src/woq/bf16-qb4w-gemm-x32c1-avx512bf16.c", "src/roofline/peak-vdpbf16ps-avx512bf16.c"],
    ),
    (
        "qkern_amx",
        "QKERN_HAVE_AMX",
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c", "-mavx512bf16",
         "-mavx512vbmi", "-mamx-tile", "-mamx-bf16"],
        "_tile_zero(0); _tile_dpbf16ps(0, 1, 2); _tile_release();",
        ["src/woq/bf16-gemm-x32c2-amx.c", "src/woq/bf16-gemv-x1c0-amx.c",
         "src/woq/tile-qb4w-gemm-x32c1-amx.c",
         "src/roofline/peak-tdpbf16ps-amx.c"],
    ),
]

BASE_SOURCES = [
    "src/cpu/cpu_detect.c",
    "src/cpu/threads.c",
    "src/woq/woq_pack.c",
    "src/woq/woq_driver.c",
    "src/woq/woq_registry.c",
    "src/woq/f32-gemm-ref.c",
    "src/woq/f32-qb4w-gemm-ref.c",
    "src/woq/convert-x-ref.c",
    "src/roofline/roofline.c",
]


def compiler_accepts(flags, statement):
    """Whether the C compiler builds `statement` with `flags`."""
    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(f"#include <immintrin.h>\nvoid probe(void) {{ {statement} }}\n")
        try:
            cc.compile([src], output_dir=tmp, extra_postargs=COMMON_CFLAGS + flags)
        except CompileError:
            return False
    return True


# Every header, a dependency of every object: a header change recompiles
# (build_clib otherwise compares each object with its .c file only).
HEADERS = sorted(glob.glob("src/**/*.h", recursive=True) + glob.glob("include/qkern/*.h"))


def libraries():
    built = [(lib, macro, flags, srcs) for lib, macro, flags, stmt, srcs in ISA_LIBRARIES
             if compiler_accepts(flags, stmt)]
    macros = [(macro, "1") for _, macro, _, _ in built]
    base = ("qkern_base", {
        "sources": BASE_SOURCES,
        "include_dirs": INCLUDE,
        "macros": macros,
        "cflags": COMMON_CFLAGS + ["-fopenmp"],
        "obj_deps": {"": HEADERS},
    })
    isa = [(lib, {"sources": srcs, "include_dirs": INCLUDE,
                  "cflags": COMMON_CFLAGS + KERNEL_CFLAGS + flags,
                  "obj_deps": {"": HEADERS}})
           for lib, _, flags, srcs in built]
    return [base] + isa


def extension(name):
    return Extension(
        f"qkern.{name}",
        sources=[f"qkern/{name.replace('.', '/')}.pyx"],
        # Relink when any C source or header is newer than the extension (the
        # static libraries recompile what those changes touch).
        depends=sorted(glob.glob("src/**/*.c", recursive=True)) + HEADERS,
        include_dirs=INCLUDE + [numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
        extra_compile_args=["-O2", "-fopenmp"] + SANITIZE_FLAGS,
        extra_link_args=["-fopenmp"] + SANITIZE_FLAGS,
    )


def cudnn_extension(name):
    """The cuDNN tiers: no cuDNN header or library at build time (dlopen at run time)."""
    return Extension(
        f"qkern.cudnn.{name}",
        sources=[f"qkern/cudnn/{name}.pyx"],
        extra_compile_args=["-O2"],
        libraries=["dl"],
    )


setup(
    options={"build": {"build_base": "build/sanitize"}} if SANITIZE else {},
    libraries=libraries(),
    ext_modules=cythonize(
        [extension("_cpu"), extension("_woq"), extension("_roofline"),
         cudnn_extension("_api"), cudnn_extension("_backend"), cudnn_extension("_graph"),
         cudnn_extension("_dlpack")],
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
        },
    ),
)
