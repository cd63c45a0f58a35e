"""AVX-512 and AMX micro-kernels built to run on an AVX2 CPU, for the testers.

Every source of the registry's levels ``avx512``, ``avx512_bf16`` and
``amx`` (``src/woq/*-<level>.c``: the kernels, and the packing of x and the
widening of panels the AMX kernels read) is compiled with AVX2 flags over
SIMDe's implementations of the intrinsics (tests/emulation/avx512_on_avx2.h,
which gives ``vdpbf16ps`` the order and flushes the Intel SDM defines) and
over C tiles (tests/emulation/amx_on_avx2.h, ``tdpbf16ps`` likewise), with
the int4 reference kernels, and with the registry, the driver and the
kernels below those levels compiled as they are (so that the emulated
kernels also run through the driver: :func:`gemm`, :func:`gemm_int4`),
into one shared library, built once and kept under ``build/emulated``. Its
calls check the kernels' logic (indexing, masks, tails, tile shapes,
sums) on machines that cannot run them; the instructions themselves run
only on AVX-512 and AMX machines.
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

import numpy as np
import pytest

import qkern
from process_support import asan_loaded
from qkern._dtypes import DTYPE_CODES, dtype_code
from qkern.packing import aligned_empty

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRELUDES = (ROOT / "tests" / "emulation" / "avx512_on_avx2.h",
            ROOT / "tests" / "emulation" / "amx_on_avx2.h")
EMULATED_ISAS = ("avx512", "avx512_bf16", "amx")
# the packing of x of the K-block kernels (include/qkern/woq.h); the
# kernels on the unpacked weight that pack x^T are given theirs by their
# registry entries (qk_test_pack_x)
PACK_X = "qk_woq_pack_x__avx512"
# an int4 kernel's bits are those of the reference of its compute (the int8
# ones are checked against the float64 reference, tests/ukernel_tester.py):
# f32_qb4w the portable kernel's, bf16_qb4w a scalar model of the order
# include/qkern/woq.h gives it
# tile_qb4w (and tilew_qb4w, the same on widened panels) a scalar model
# with the signature of their K-block kernels
REFERENCE_SOURCES = ("src/woq/f32-qb4w-gemm-ref.c", "tests/emulation/bf16-qb4w-model.c",
                     "tests/emulation/tile-qb4w-model.c")
INT4_REFERENCES = {"f32_qb4w": "qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref",
                   "bf16_qb4w": "qk_test_bf16_qb4w_model",
                   "tile_qb4w": "qk_test_tile_qb4w_model",
                   "tilew_qb4w": "qk_test_tile_qb4w_model"}
_KBLOCK_REFERENCES = {"qk_test_tile_qb4w_model"}
# the registry (with every level's entries), the driver and what they
# reference below the emulated levels, compiled with AVX2 flags
DRIVER_SOURCES = ("src/woq/woq_driver.c", "src/woq/woq_pack.c", "src/woq/woq_registry.c",
                  "src/woq/f32-gemm-ref.c", "src/woq/convert-x-ref.c",
                  "tests/emulation/registry-lookup.c")
_FLAGS = ["-O2", "-std=gnu11", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off",
          f"-I{ROOT / 'include'}", f"-I{ROOT / 'src' / 'woq'}"]
_NAME = re.compile(r"(?P<compute>\w+?)_(?P<op>gemm|gemv)_(?P<mr>\d+)x(?P<nr>\d+)c(?P<kr>\d+)"
                   r"__(?P<isa>\w+)")
_UKERNEL_ARGS = [ctypes.c_size_t] * 3 + [ctypes.c_void_p, ctypes.c_int] + \
    [ctypes.c_void_p] * 4 + [ctypes.c_ssize_t]
_INT4_ARGS = [ctypes.c_size_t] * 4 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_ssize_t]
_KBLOCK_ARGS = [ctypes.c_size_t] * 3 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [
                                            ctypes.c_ssize_t]
_INT4_KBLOCK_ARGS = [ctypes.c_size_t] * 4 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                             ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_ssize_t]
_PACK_X_ARGS = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                ctypes.c_size_t]
_WIDEN_ARGS = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]


def symbol(kern) -> str:
    """The symbol of a kernel's micro-kernel, by the naming rule of
    include/qkern/woq_ukernels.h (``f32_qb4w_gemm_8x32c1__avx512`` is
    ``qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512``; a K-block kernel's
    is ``..._kblock_...``)."""
    f = _NAME.fullmatch(kern.name).groupdict()
    role = "kblock" if kern.kind == "kblock" else "ukernel"
    return f"qk_woq_{f['compute']}_{f['op']}_{role}_{f['mr']}x{f['nr']}c{f['kr']}__{f['isa']}"


def widen_symbol(kern) -> str:
    """The AVX-512 widening of the panels a K-block kernel reads widened
    (``qk_woq_widen_x32c2__avx512`` for layout (32, 2), ``..._x32c1_...``
    for the packed int4 layout)."""
    nr, kr = kern.layout
    return f"qk_woq_widen_x{nr}c{kr}__avx512"


def _sources(levels) -> list:
    """Every source of ISA ``levels``, by the file naming rule of
    DESIGN.md (``src/woq/*-avx512bf16.c`` for ``avx512_bf16``)."""
    return sorted(str(path.relative_to(ROOT)) for isa in levels
                  for path in (ROOT / "src" / "woq").glob(f"*-{isa.replace('_', '')}.c"))


def emulated_kernels(weight_format: str, kblock: bool = False) -> list:
    """The registry's kernels of the emulated levels on weights of
    ``weight_format`` that have a single-call micro-kernel, or with
    ``kblock`` those that run one K block per call over packed x."""
    return [k for k in qkern.kernels()
            if k.isa in EMULATED_ISAS and k.weight_format == weight_format
            and (k.kind == "kblock") == kblock]


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
    kernels = [k for fmt in (qkern.dispatch.INT8, qkern.dispatch.INT4) for kblock in (False, True)
               for k in emulated_kernels(fmt, kblock)]
    sources = _sources(EMULATED_ISAS)
    native = [*DRIVER_SOURCES, *_sources(("avx2",))]
    # under make sanitize, ASan checks the emulated masked loads and stores
    # (lane by lane), which it cannot see in the hardware's
    sanitize = ["-fsanitize=address", "-fno-omit-frame-pointer"] if asan_loaded() else []
    emulated_flags = [*_FLAGS, *sanitize, "-Og", "-mavx2", "-mfma", "-mf16c", "-Wno-psabi",
                      f"-I{simde_py.get_include()}",
                      *(arg for prelude in PRELUDES for arg in ("-include", str(prelude)))]
    native_flags = [*_FLAGS, *sanitize, "-mavx2", "-mfma", "-mf16c", "-fopenmp",
                    *(f"-DQKERN_HAVE_{isa.upper()}" for isa in ("avx2", *EMULATED_ISAS))]
    compiler = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    digest = hashlib.sha256(repr((compiler.stdout, emulated_flags, native_flags,
                                  importlib.metadata.version("simde-py"))).encode())
    headers = [*(ROOT / "src").rglob("*.h"), *(ROOT / "include").rglob("*.h"), *PRELUDES]
    for path in sorted([*sources, *REFERENCE_SOURCES, *native,
                        *(str(h.relative_to(ROOT)) for h in headers)]):
        digest.update(path.encode() + (ROOT / path).read_bytes())
    out = ROOT / "build" / "emulated" / digest.hexdigest()[:16]
    lib = out / f"emulated{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    if not lib.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)  # work beside it: os.replace
        work = pathlib.Path(tempfile.mkdtemp(prefix="tmp-", dir=out.parent))
        try:
            objects = []
            for source in [*sources, *REFERENCE_SOURCES, *native]:
                objects.append(work / (pathlib.Path(source).stem + ".o"))
                # -Og: a fifth of -O2's compile time (SIMDe inlines a lot)
                flags = (emulated_flags if source in sources else
                         native_flags if source in native else [*_FLAGS, *sanitize])
                subprocess.run([cc, *flags, "-c", str(ROOT / source), "-o", str(objects[-1])],
                               check=True)
            # -Bsymbolic: the library's calls stay in it, whatever qkern's
            # extension (which holds the same driver) exports
            subprocess.run([cc, "-shared", "-fopenmp", "-Wl,-Bsymbolic", *sanitize,
                            *map(str, objects), "-o", str(work / lib.name), "-lm"], check=True)
            out.mkdir(parents=True, exist_ok=True)
            os.replace(work / lib.name, lib)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    handle = ctypes.CDLL(str(lib))
    int4 = qkern.dispatch.INT4
    for k in kernels:
        getattr(handle, symbol(k)).argtypes = {
            ("kblock", False): _KBLOCK_ARGS, ("kblock", True): _INT4_KBLOCK_ARGS,
            ("panels", True): _INT4_ARGS}.get((k.kind, k.weight_format == int4), _UKERNEL_ARGS)
        if k.widened and k.kind == "kblock":
            getattr(handle, widen_symbol(k)).argtypes = _WIDEN_ARGS
    getattr(handle, PACK_X).argtypes = _PACK_X_ARGS
    handle.qk_test_kernel.argtypes = [ctypes.c_char_p]
    handle.qk_test_kernel.restype = ctypes.c_void_p
    handle.qk_test_pack_x.argtypes = [ctypes.c_void_p, *_PACK_X_ARGS]
    handle.qk_woq_widened_panel_size.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    handle.qk_woq_widened_panel_size.restype = ctypes.c_size_t
    handle.qk_woq_widened_size.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    handle.qk_woq_widened_size.restype = ctypes.c_size_t
    handle.qk_woq_widen_weight.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 2 + [
        ctypes.c_void_p]
    common = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]  # x_stride, x_offsets, weight
    handle.qk_woq_gemm.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 3 + [
        ctypes.c_int, ctypes.c_void_p, *common, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    handle.qk_woq_gemm_int4.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 4 + [
        ctypes.c_int, ctypes.c_void_p, *common, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    for reference in INT4_REFERENCES.values():
        getattr(handle, reference).argtypes = (_INT4_KBLOCK_ARGS if reference in _KBLOCK_REFERENCES
                                               else _INT4_ARGS)
    return handle


def ukernel_call(kern):
    """A function calling the emulated int8 micro-kernel of ``kern`` as
    ``qkern._woq.ukernel(kern.index, ...)`` does, its index left out."""
    fn = getattr(library(), symbol(kern))

    def call(mr, nc, kc, x, dtype, panels, scale, bias, c, c_stride):
        rows = (ctypes.c_void_p * mr)(*(x.ctypes.data + i * x.strides[0] for i in range(mr)))
        if kern.packs_x:  # its rows packed transposed by its pack_x, as the driver packs them
            name = next(n for n, code in DTYPE_CODES.items() if code == dtype)
            chunk = kern.planes(name) * 2048
            packed_x = aligned_empty(-(-kc // 32) * chunk)
            packed_x[:] = -1  # bf16 NaNs where the packer writes nothing: never read into y
            entry = _driver_args(kern, None)[0]
            for i in range(mr):
                library().qk_test_pack_x(entry, rows[i], dtype, kc, i, packed_x.ctypes.data, chunk)
            rows[0] = packed_x.ctypes.data
        fn(mr, nc, kc, rows, dtype, panels.ctypes.data, scale.ctypes.data,
           bias.ctypes.data if bias is not None else None, c.ctypes.data, c_stride)

    return call


def widened_weight(kern):
    """A function widening a packed (n, k) weight for ``kern`` as
    ``qkern._woq.widen_weight`` does, by the emulated library's driver
    (qk_woq_widen_weight, with the widening of its registry entry)."""

    def widen(panels, n, k):
        entry, lib = _driver_args(kern, None)[0], library()
        wide = aligned_empty(lib.qk_woq_widened_size(entry, n, k))
        assert lib.qk_woq_widen_weight(entry, panels.ctypes.data, n, k, wide.ctypes.data) == 0
        return wide

    return widen


def kblock_run(fn, kern, x, dtype, panels, nc, c, k_block, scale=None, bias=None, group_size=0,
               sz=None):
    """Runs the K-block function ``fn`` (of the emulated library) of
    ``kern``'s layout as the driver (src/woq/woq_driver.c) runs it on one
    group of ``len(x) <= 32`` rows: packs x (``dtype``) into bf16 planes,
    then calls ``fn`` block of ``k_block`` k by block, in order, with the
    f32 sums carried in a 64-byte aligned buffer, into ``c``, the (mr, nc)
    output, on whole packed ``panels`` holding ``nc`` columns (for a
    kernel that reads widened panels, each block of each panel widened
    first; an int8 one widens its even blocks itself as it reads them, as
    on the driver's first row step, into a buffer that must then hold the
    widening function's bytes, and reads its odd blocks widened, as on the
    later row steps). int8 (qk_woq_kblock_fn): layout (32, 2), ``scale``
    and ``bias`` (or None) holding whole panels. int4 (qk_woq_int4_kblock_fn,
    ``group_size`` > 0): the packed int4 layout, ``sz`` the (K /
    group_size, nc, 2) scales_and_zeros, the group sums of f32(x) computed
    here as the driver computes them, and ``k_block`` a multiple of
    ``group_size``."""
    lib, (nr, kr) = library(), kern.layout
    mr, k = x.shape
    code, planes = dtype_code(dtype), kern.planes(dtype)
    chunk = planes * 2048
    packed_x = aligned_empty(-(-k // 32) * chunk)
    for i in range(mr):
        getattr(lib, PACK_X)(x[i].ctypes.data, code, k, i, packed_x.ctypes.data, chunk)
    n_panels = -(-nc // 32)
    acc = aligned_empty(4 * mr * n_panels * 32).view(np.float32)
    acc[:] = np.nan  # the first block must not read it
    bias_ptr = bias.ctypes.data if bias is not None else None
    if group_size:
        groups = k // group_size
        xs = np.ascontiguousarray(np.add.accumulate(  # fp32 sums in increasing k, from 0
            x.astype(np.float32).reshape(mr, groups, group_size), axis=2)[:, :, -1])
    panel_bytes = k * 16 if group_size else -(-k // kr) * kr * nr
    for k0 in range(0, max(k, 1), k_block):
        kc = min(k_block, k - k0)
        a, first, last = packed_x.ctypes.data + k0 // 32 * chunk, k0 == 0, k0 + kc >= k
        w, w_stride = panels.ctypes.data + k0 * (16 if group_size else nr), panel_bytes
        widen_to = None
        if kern.widened:
            wide_stride = lib.qk_woq_widened_panel_size(_driver_args(kern, None)[0], kc)
            wide = aligned_empty(n_panels * wide_stride)
            for q in range(n_panels):
                getattr(lib, widen_symbol(kern))(w + q * panel_bytes, 1, kc,
                                                 wide.ctypes.data + q * wide_stride)
            if group_size or k0 // k_block % 2:
                w, w_stride = wide.ctypes.data, wide_stride
            else:
                widened_here = aligned_empty(wide.size + 64)  # 64 guard bytes past the end
                widened_here.view(np.uint8)[:] = 0xA5
                widen_to = widened_here.ctypes.data
        if group_size:
            g0 = k0 // group_size
            fn(mr, nc, kc, group_size, a, xs.ctypes.data + 4 * g0, groups, code, w, w_stride,
               sz.ctypes.data + g0 * sz.strides[0], sz.strides[0], acc.ctypes.data, first, last,
               bias_ptr, c.ctypes.data, c.strides[0])
        else:
            fn(mr, nc, kc, a, code, w, w_stride, widen_to, acc.ctypes.data, first, last,
               scale.ctypes.data, bias_ptr, c.ctypes.data, c.strides[0])
            if widen_to is not None:
                assert np.array_equal(widened_here[:wide.size], wide), (
                    f"{kern.name} widened block {k0 // k_block} other than {widen_symbol(kern)}")
                assert (widened_here[wide.size:].view(np.uint8) == 0xA5).all(), (
                    f"{kern.name} wrote past the widened block")


class _Blocking(ctypes.Structure):
    """qk_woq_blocking (include/qkern/woq.h)."""
    _fields_ = [(name, ctypes.c_uint32)
                for name in ("rows", "chunk_bytes", "k_block", "min_macs_per_thread", "split")]


def _driver_args(kern, blocking):
    """The registry entry of ``kern`` in the emulated library, and a
    pointer to ``blocking`` (a :class:`qkern.dispatch.Blocking`; None: the
    kernel's default)."""
    entry = library().qk_test_kernel(kern.name.encode())
    assert entry, f"{kern.name} is not in the emulated library's registry"
    return entry, (ctypes.byref(_Blocking(*blocking.to_driver())) if blocking is not None
                   else None)


def gemm(kern, x, packed, scale, bias, y, threads, blocking=None) -> int:
    """qk_woq_gemm() of the emulated library on the int8 ``kern``: ``x``
    (M, K) rows of its dtype into ``y`` (M, N), ``packed`` in the kernel's
    layout, ``scale`` and ``bias`` (or None) f32 holding whole panels; the
    status code."""
    entry, cut = _driver_args(kern, blocking)
    (m, k), n = x.shape, y.shape[1]
    return library().qk_woq_gemm(
        entry, cut, m, n, k, dtype_code(x.dtype), x.ctypes.data, x.strides[0], None,
        packed.ctypes.data, scale.ctypes.data, bias.ctypes.data if bias is not None else None,
        y.ctypes.data, y.strides[0], threads)


def gemm_int4(kern, x, packed, group_size, sz, bias, y, threads, blocking=None) -> int:
    """qk_woq_gemm_int4() of the emulated library on the int4 ``kern``:
    ``x`` (M, K) rows of its dtype into ``y`` (M, N), ``packed`` the packed
    int4 weight, ``sz`` the (K / group_size, N, 2) scales_and_zeros, ``bias``
    (or None) f32 holding whole panels; the status code."""
    entry, cut = _driver_args(kern, blocking)
    (m, k), n = x.shape, y.shape[1]
    return library().qk_woq_gemm_int4(
        entry, cut, m, n, k, group_size, dtype_code(x.dtype), x.ctypes.data, x.strides[0], None,
        packed.ctypes.data, sz.ctypes.data, bias.ctypes.data if bias is not None else None,
        y.ctypes.data, y.strides[0], threads)
