"""The floating-point environment: results do not depend on the caller's.

Each thread that runs a kernel sets MXCSR to IEEE 754 defaults (round to
nearest even, gradual underflow, exceptions masked) and restores the
caller's afterwards (include/qkern/fpenv.h, docs/semantics.rst).  A caller
that set flush-to-zero (FTZ), denormals-are-zero (DAZ), another rounding
mode or an unmasked exception used to reach the columns its own thread
computed and not those of the OpenMP workers, so results depended on
``num_threads``.  MXCSR is set here through a few lines of C
(tests/runtime/mxcsr.c) compiled with the system compiler; results are compared as
bits, since NumPy's own comparisons obey DAZ.
"""

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qkern
from process_support import run_python
from reference import DTYPES

HERE = Path(__file__).parent
DEFAULT = 0x1F80
FTZ, DAZ = 0x8000, 0x0040
ROUND_TOWARD_ZERO = 0x6000
UNMASK_INVALID_AND_OVERFLOW = ~0x0280 & 0xFFFF

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="MXCSR is x86's")


@pytest.fixture(scope="module")
def mxcsr_library(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/runtime/mxcsr.c")
    lib = tmp_path_factory.mktemp("mxcsr") / "libmxcsr.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(HERE / "mxcsr.c")],
                   check=True)
    return lib


@pytest.fixture(scope="module")
def mxcsr(mxcsr_library):
    lib = ctypes.CDLL(str(mxcsr_library))
    lib.mxcsr_get.restype = ctypes.c_uint
    lib.mxcsr_set.argtypes = [ctypes.c_uint]
    return lib


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.itemsize == 4 else np.uint16).copy()


def _problem(dtype):
    """One row over 2048 x 2048 (enough work for two threads).  float32 and
    bfloat16 activations lie around the bottom of the fp32 range, mostly
    subnormal, so that FTZ, DAZ and the rounding mode all change the sums;
    float16 ones cannot reach that range (nor can their products with int8
    weights), so they are plain normal values, for the rounding mode."""
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (2048, 2048), dtype=np.int8)
    tiny = np.float32(1e-38) if dtype != np.float16 else np.float32(1)
    x = (rng.standard_normal((1, 2048)) * tiny).astype(np.float32).astype(dtype)
    scales = rng.uniform(0.5, 2, 2048).astype(dtype)
    return w, x, scales


MODES = {"FTZ": FTZ, "DAZ": DAZ, "FTZ+DAZ": FTZ | DAZ, "round-toward-zero": ROUND_TOWARD_ZERO}
CASES = [pytest.param(dtype, MODES[mode], id=f"{mode}-{np.dtype(dtype).name}")
         for dtype in DTYPES for mode in MODES
         if dtype != np.float16 or mode == "round-toward-zero"]


@pytest.mark.parametrize("dtype, caller", CASES)
def test_callers_mxcsr_changes_no_bit_and_is_restored(mxcsr, dtype, caller):
    w, x, scales = _problem(dtype)
    layer = qkern.WoqLinear(w, scales)
    assert mxcsr.mxcsr_get() & 0xFFC0 == DEFAULT
    want = _bits(layer(x, num_threads=2))  # also starts the OpenMP worker
    # the functional op runs a kernel on the unpacked weight here, which may
    # sum in another order than the layer's: it is held to its own bits
    want_fn = _bits(qkern.weight_int8pack_mm(x, w, scales, num_threads=2))
    saved = mxcsr.mxcsr_get()
    try:
        mxcsr.mxcsr_set(DEFAULT | caller)
        got = {threads: _bits(layer(x, num_threads=threads)) for threads in (2, 1, 2)}
        got_fn = _bits(qkern.weight_int8pack_mm(x, w, scales, num_threads=2))
        after = mxcsr.mxcsr_get()
    finally:
        mxcsr.mxcsr_set(saved)
    assert after & 0xFFC0 == DEFAULT | caller, hex(after)
    for how, bits in got.items():
        assert (bits == want).all(), (how, int((bits != want).sum()))
    assert (got_fn == want_fn).all(), ("function", int((got_fn != want_fn).sum()))


@pytest.mark.parametrize("dtype, caller", CASES)
def test_problem_is_sensitive_to_the_environment(mxcsr, dtype, caller):
    """Control: the same sums, done by NumPy in the calling thread, do change
    under each setting, so the test above could fail."""
    w, x, scales = _problem(dtype)
    xw = (x.astype(np.float32) * w.astype(np.float32))

    def sums():
        return _bits(xw.sum(axis=1, dtype=np.float32) * scales.astype(np.float32))

    plain = sums()
    saved = mxcsr.mxcsr_get()
    try:
        mxcsr.mxcsr_set(DEFAULT | caller)
        changed = sums()
    finally:
        mxcsr.mxcsr_set(saved)
    assert (plain != changed).mean() > 0.1


def test_unmasked_exceptions_do_not_trap_in_kernels(mxcsr_library):
    """A caller that unmasked invalid and overflow exceptions got SIGFPE from
    inf * 0 inside a kernel; now the kernels run masked and the result has
    the documented NaN and infinity (a process of its own: a trap kills it)."""
    proc = run_python(f"""
        import ctypes, numpy as np, qkern
        lib = ctypes.CDLL({str(mxcsr_library)!r})
        lib.mxcsr_get.restype = ctypes.c_uint
        w = np.zeros((64, 64), np.int8); w[1] = 1
        x = np.full((4, 64), np.inf, np.float32)
        layer = qkern.WoqLinear(w, np.ones(64, np.float32))
        lib.mxcsr_set(lib.mxcsr_get() & {UNMASK_INVALID_AND_OVERFLOW})
        y = layer(x, num_threads=2)
        assert np.isnan(y[:, 0]).all() and (y[:, 1] == np.inf).all(), y[:, :2]
        print(hex(lib.mxcsr_get()))
        """)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout, 16) & 0x0280 == 0, proc.stdout  # still unmasked after the call
