"""AVX-512 kernels on any AVX2 machine: each AVX-512 int4 kernel source is
compiled here without its AVX-512 flags, over SIMDe's implementations of
the intrinsics (tests/emulation/avx512_on_avx2.h), and must give the
reference kernel's bits on every mr, column count, dtype and group size.
This checks the kernels' logic (indexing, masks, tails, the order of the
sums) where the CPU cannot run them; their instructions run natively in
tests/woq/test_int4.py on AVX-512 machines."""

import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest
import simde_py

import qkern
from qkern._dtypes import bfloat16, dtype_code
from qkern.dispatch import INT4

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRELUDE = ROOT / "tests" / "emulation" / "avx512_on_avx2.h"
EMULATED_ISA = "avx512"
_NAME = re.compile(r"(?P<compute>\w+?)_(?P<op>gemm|gemv)_(?P<mr>\d+)x(?P<nr>\d+)c(?P<kr>\d+)"
                   r"__(?P<isa>\w+)")


def _source_and_symbol(name: str) -> tuple:
    """A registry kernel's source file and micro-kernel symbol, by the
    naming rule of include/qkern/woq_ukernels.h."""
    f = _NAME.fullmatch(name).groupdict()
    tile = f"{f['mr']}x{f['nr']}c{f['kr']}__{f['isa']}"
    source = f"src/woq/{f['compute'].replace('_', '-')}-{f['op']}-x{f['nr']}c{f['kr']}-{f['isa']}.c"
    return source, f"qk_woq_{f['compute']}_{f['op']}_ukernel_{tile}"


EMULATED = [k for k in qkern.kernels() if k.isa == EMULATED_ISA and k.weight_format == INT4]
REFERENCE = ("src/woq/f32-qb4w-gemm-ref.c", "qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref")
FLAGS = ["-O2", "-std=gnu11", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off",
         f"-I{ROOT / 'include'}", f"-I{ROOT / 'src' / 'woq'}"]
DTYPES = (np.float32, np.float16, bfloat16)
_INT4_ARGS = [ctypes.c_size_t] * 4 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_ssize_t]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The emulated kernels and the reference one in a shared library."""
    if "avx2" not in qkern.cpu_features() or "fma" not in qkern.cpu_features():
        pytest.skip("the emulation runs SIMDe on AVX2 + FMA, which this CPU lacks")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert cc, "no C compiler (cc or gcc) on PATH"
    out = tmp_path_factory.mktemp("emulated")
    objects = []
    for source in sorted({_source_and_symbol(k.name)[0] for k in EMULATED}):
        objects.append(out / (pathlib.Path(source).stem + ".o"))
        # -Og: a fifth of -O2's compile time (SIMDe inlines a lot)
        subprocess.run([cc, *FLAGS, "-Og", "-mavx2", "-mfma", "-mf16c", "-Wno-psabi",
                        f"-I{simde_py.get_include()}", "-include", str(PRELUDE), "-c",
                        str(ROOT / source), "-o", str(objects[-1])], check=True)
    objects.append(out / "reference.o")
    subprocess.run([cc, *FLAGS, "-c", str(ROOT / REFERENCE[0]), "-o", str(objects[-1])],
                   check=True)
    lib = out / f"emulated{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    subprocess.run([cc, "-shared", *map(str, objects), "-o", str(lib), "-lm"], check=True)
    handle = ctypes.CDLL(str(lib))
    for name in [REFERENCE[1], *(_source_and_symbol(k.name)[1] for k in EMULATED)]:
        getattr(handle, name).argtypes = _INT4_ARGS
    return handle


def _run(fn, rows, nc, kc, group_size, x_rows, dtype, panels, sz, bias, c):
    """One micro-kernel call on ``rows`` of ``x_rows`` (f32 with group sums)."""
    ptrs = (ctypes.c_void_p * len(rows))(*(x_rows[r].ctypes.data for r in rows))
    fn(len(rows), nc, kc, group_size, ptrs, dtype_code(dtype), panels.ctypes.data,
       sz.ctypes.data, sz.strides[0], bias.ctypes.data if bias is not None else None,
       c.ctypes.data, c.strides[0])


def _x_with_group_sums(x, group_size):
    """Rows of f32 x followed by their group sums, each summed in increasing
    k from 0 in f32 (qk_woq_group_sums)."""
    m, k = x.shape
    sums = np.add.accumulate(x.reshape(m, k // group_size, group_size), axis=2)[:, :, -1]
    return np.ascontiguousarray(np.concatenate([x, sums], axis=1), dtype=np.float32)


def test_every_kernel_of_the_emulated_isa_is_emulated():
    """The registry has AVX-512 int4 kernels to check, each named by the
    rule this test derives its source and symbol from."""
    assert EMULATED, f"no {EMULATED_ISA} int4 kernel in the registry"
    for kern in EMULATED:
        source, _ = _source_and_symbol(kern.name)
        assert (ROOT / source).is_file(), (kern.name, source)


@pytest.mark.parametrize("kern", EMULATED, ids=lambda k: k.name)
def test_emulated_int4_kernel_gives_the_reference_bits(library, kern):
    name, mr_max = _source_and_symbol(kern.name)[1], kern.mr
    kernel, reference = getattr(library, name), getattr(library, REFERENCE[1])
    rng = np.random.default_rng(11)
    for dtype in DTYPES:
        for group_size, groups in ((32, 9), (64, 2)):  # 9: four side by side, two, one
            kc = group_size * groups
            for nc in (1, 16, 17, 32, 45, 64, 100, 129, 160):
                q = rng.integers(0, 16, (nc, kc), dtype=np.uint8)
                panels = qkern.pack_int4(q).reshape(-1)
                sz = rng.standard_normal((groups, nc, 2)).astype(dtype)
                bias = qkern.woq._padded_f32(rng.standard_normal(nc).astype(np.float32), 32)
                x = rng.standard_normal((mr_max, kc)).astype(dtype).astype(np.float32)
                x_rows = _x_with_group_sums(x, group_size)
                bits = np.uint32 if dtype == np.float32 else np.uint16
                want = {}
                for b in (bias, None):
                    want[b is None] = np.empty((mr_max, nc), dtype)
                    for r in range(mr_max):  # the reference takes at most 4 rows
                        _run(reference, [r], nc, kc, group_size, x_rows, dtype, panels, sz, b,
                             want[b is None][r:r + 1])
                for mr in range(1, mr_max + 1):
                    for b in (bias, None):
                        big = np.full((mr + 2, nc + 11), np.nan, dtype)
                        c = big[1:1 + mr, 3:3 + nc]
                        _run(kernel, range(mr), nc, kc, group_size, x_rows, dtype, panels, sz,
                             b, c)
                        outside = big.astype(np.float64)
                        outside[1:1 + mr, 3:3 + nc] = np.nan
                        assert np.isnan(outside).all(), f"{name} wrote outside its output"
                        assert np.array_equal(c.view(bits), want[b is None][:mr].view(bits)), (
                            np.dtype(dtype).name, group_size, nc, mr, b is not None)
