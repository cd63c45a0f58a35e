"""AVX-512 micro-kernels built to run on an AVX2 CPU, for the testers.

Each single-call kernel of the registry's levels ``avx512`` and
``avx512_bf16`` is compiled from its source with AVX2 flags over SIMDe's
implementations of the intrinsics (tests/emulation/avx512_on_avx2.h, which
gives ``vdpbf16ps`` the order and flushes the Intel SDM defines), with the
int4 reference kernels, into one shared library, built once and kept under
``build/emulated``. Its calls check the kernels' logic (indexing, masks,
tails, sums) on machines that cannot run them; the instructions themselves
run only on AVX-512 machines.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sysconfig
import tempfile

import pytest

import qkern
from process_support import asan_loaded

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRELUDE = ROOT / "tests" / "emulation" / "avx512_on_avx2.h"
EMULATED_ISAS = ("avx512", "avx512_bf16")
# an int4 kernel's bits are those of the reference of its compute (the int8
# ones are checked against the float64 reference, tests/ukernel_tester.py):
# f32_qb4w the portable kernel's, bf16_qb4w a scalar model of the order
# include/qkern/woq.h gives it
REFERENCE_SOURCES = ("src/woq/f32-qb4w-gemm-ref.c", "tests/emulation/bf16-qb4w-model.c")
INT4_REFERENCES = {"f32_qb4w": "qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref",
                   "bf16_qb4w": "qk_test_bf16_qb4w_model"}
_FLAGS = ["-O2", "-std=gnu11", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off",
          f"-I{ROOT / 'include'}", f"-I{ROOT / 'src' / 'woq'}"]
_NAME = re.compile(r"(?P<compute>\w+?)_(?P<op>gemm|gemv)_(?P<mr>\d+)x(?P<nr>\d+)c(?P<kr>\d+)"
                   r"__(?P<isa>\w+)")
_UKERNEL_ARGS = [ctypes.c_size_t] * 3 + [ctypes.c_void_p, ctypes.c_int] + \
    [ctypes.c_void_p] * 4 + [ctypes.c_ssize_t]
_INT4_ARGS = [ctypes.c_size_t] * 4 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_ssize_t]


def source_and_symbol(name: str) -> tuple:
    """A kernel's source file and micro-kernel symbol, by the naming rule of
    include/qkern/woq_ukernels.h (``f32_qb4w_gemm_8x32c1__avx512`` is
    ``qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512`` in
    ``src/woq/f32-qb4w-gemm-x32c1-avx512.c``)."""
    f = _NAME.fullmatch(name).groupdict()
    tile = f"{f['mr']}x{f['nr']}c{f['kr']}__{f['isa']}"
    source = f"src/woq/{f['compute'].replace('_', '-')}-{f['op']}-x{f['nr']}c{f['kr']}-{f['isa']}.c"
    return source, f"qk_woq_{f['compute']}_{f['op']}_ukernel_{tile}"


def emulated_kernels(weight_format: str) -> list:
    """The registry's kernels of the emulated levels that have a
    single-call micro-kernel on weights of ``weight_format``."""
    return [k for k in qkern.kernels()
            if k.isa in EMULATED_ISAS and k.weight_format == weight_format
            and k.kind != "kblock"]


def int4_reference(name: str) -> str:
    """The symbol of the reference whose bits the int4 kernel ``name`` gives
    (its compute: the name's prefix up to ``_gemm``)."""
    return INT4_REFERENCES[_NAME.fullmatch(name)["compute"]]


def _skip_unless_runnable() -> None:
    """SIMDe's AVX-512 runs on 256-bit halves: the test skips (with the
    reason) on a CPU without AVX2, FMA and F16C."""
    features = qkern.cpu_features()
    if not all(features[f] for f in ("avx2", "fma", "f16c")):
        pytest.skip("the emulation runs SIMDe on AVX2, FMA and F16C, which this CPU lacks")


@functools.cache
def library() -> ctypes.CDLL:
    """Every emulated kernel and the int4 references in one library
    (the calling test skips where the CPU cannot run it), built on first
    use into ``build/emulated/<digest>`` (the digest of the sources,
    headers and flags, so a later process reuses it)."""
    _skip_unless_runnable()
    import simde_py  # a test dependency (pyproject.toml), needed only here

    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert cc, "no C compiler (cc or gcc) on PATH"
    kernels = [k for fmt in (qkern.dispatch.INT8, qkern.dispatch.INT4)
               for k in emulated_kernels(fmt)]
    sources = sorted({source_and_symbol(k.name)[0] for k in kernels})
    # under make sanitize, ASan checks the emulated masked loads and stores
    # (lane by lane), which it cannot see in the hardware's
    sanitize = ["-fsanitize=address", "-fno-omit-frame-pointer"] if asan_loaded() else []
    emulated_flags = [*_FLAGS, *sanitize, "-Og", "-mavx2", "-mfma", "-mf16c", "-Wno-psabi",
                      f"-I{simde_py.get_include()}", "-include", str(PRELUDE)]
    compiler = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    digest = hashlib.sha256(repr((compiler.stdout, emulated_flags,
                                  importlib.metadata.version("simde-py"))).encode())
    headers = [*(ROOT / "src" / "woq").glob("*.h"), *(ROOT / "include").rglob("*.h"), PRELUDE]
    for path in sorted([*sources, *REFERENCE_SOURCES,
                        *(str(h.relative_to(ROOT)) for h in headers)]):
        digest.update(path.encode() + (ROOT / path).read_bytes())
    out = ROOT / "build" / "emulated" / digest.hexdigest()[:16]
    lib = out / f"emulated{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    if not lib.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)  # work beside it: os.replace
        work = pathlib.Path(tempfile.mkdtemp(prefix="tmp-", dir=out.parent))
        try:
            objects = []
            for source in [*sources, *REFERENCE_SOURCES]:
                objects.append(work / (pathlib.Path(source).stem + ".o"))
                # -Og: a fifth of -O2's compile time (SIMDe inlines a lot)
                flags = emulated_flags if source in sources else [*_FLAGS, *sanitize]
                subprocess.run([cc, *flags, "-c", str(ROOT / source), "-o", str(objects[-1])],
                               check=True)
            subprocess.run([cc, "-shared", *sanitize, *map(str, objects), "-o",
                            str(work / lib.name), "-lm"], check=True)
            out.mkdir(parents=True, exist_ok=True)
            os.replace(work / lib.name, lib)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    handle = ctypes.CDLL(str(lib))
    for k in kernels:
        symbol = source_and_symbol(k.name)[1]
        getattr(handle, symbol).argtypes = (
            _INT4_ARGS if k.weight_format == qkern.dispatch.INT4 else _UKERNEL_ARGS)
    for symbol in INT4_REFERENCES.values():
        getattr(handle, symbol).argtypes = _INT4_ARGS
    return handle


def ukernel_call(kern):
    """A function calling the emulated int8 micro-kernel of ``kern`` as
    ``qkern._woq.ukernel(kern.index, ...)`` does, its index left out."""
    fn = getattr(library(), source_and_symbol(kern.name)[1])

    def call(mr, nc, kc, x, dtype, panels, scale, bias, c, c_stride):
        rows = (ctypes.c_void_p * mr)(*(x.ctypes.data + i * x.strides[0] for i in range(mr)))
        fn(mr, nc, kc, rows, dtype, panels.ctypes.data, scale.ctypes.data,
           bias.ctypes.data if bias is not None else None, c.ctypes.data, c_stride)

    return call
