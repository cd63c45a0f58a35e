"""Every ``panels`` and ``unpacked`` micro-kernel, called directly (one call,
no driver): XNNPACK-style sweeps over the tile's edges with
tests/ukernel_tester.py; the AVX-512 ones this CPU cannot run, built over
SIMDe (tests/emulated_kernels.py), go through the same sweeps.  The
K-block (AMX) kernels have no single call; tests/woq/test_kernels.py
covers them through the driver and its blockings.
"""

import numpy as np
import pytest

import emulated_kernels as emu
from conftest import kernel_params
from qkern import _woq
from qkern._dtypes import dtype_code
from qkern.dispatch import INT8
from reference import DTYPES, first_dtype
from ukernel_tester import GemmTester

PARAMS = [p for p in kernel_params() if p.values[0].kind != "kblock"]
# the AVX-512 kernels this run cannot call (the CPU or QKERN_ISA caps it below
# them), built over SIMDe (tests/emulated_kernels.py)
EMULATED = [pytest.param(k, id=f"{k.name}[emulated]") for k in emu.emulated_kernels(INT8)
            if not k.available]


def _testers(kern):
    call = widen = None
    if not kern.available:  # only emulated kernels get here unavailable
        call, widen = emu.ukernel_call(kern), emu.widened_weight(kern)
    for dtype in DTYPES:
        if dtype.name in kern.dtypes:
            yield GemmTester(kern, call, widen).mr(kern.mr).nr(kern.nr).kr(kern.kr).dtype(dtype)


def _krs(kern):
    return max(kern.kr, 1)


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_k_eq_kr(kern):
    for t in _testers(kern):
        t.m(kern.mr).n(kern.nr).k(_krs(kern)).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_k_lt_kr_gt_kr_and_not_a_multiple(kern):
    for t in _testers(kern):
        for k in range(1, 3 * _krs(kern) + 2):
            t.m(kern.mr).n(kern.nr).k(k).seed(k).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_k_multiple_of_kr_and_zero(kern):
    for t in _testers(kern):
        for k in (0, 8 * _krs(kern), 64 * _krs(kern)):
            t.m(kern.mr).n(kern.nr).k(k).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_n_lt_nr_gt_nr_and_several_panels(kern):
    for t in _testers(kern):
        for n in sorted({1, max(kern.nr - 1, 1), kern.nr + 1, 2 * kern.nr, 3 * kern.nr + 5}):
            t.m(kern.mr).n(n).k(17).seed(n).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_m_below_mr(kern):
    # kernels specialise each row count, and may take several panels at a
    # time for few rows (then the last ones alone): n covers both steps
    for t in _testers(kern):
        for m in range(1, kern.mr):
            for n in (1, kern.nr + 3, 2 * kern.nr + 5, 3 * kern.nr + 5, 4 * kern.nr + 5):
                t.m(m).n(n).k(9).seed(m * n).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_strided_a_and_c(kern):
    for t in _testers(kern):
        t.m(kern.mr).n(2 * kern.nr + 1).k(13).a_stride(13 + 7).c_stride(2 * kern.nr + 9).test()


@pytest.mark.parametrize("kern", PARAMS + EMULATED)
def test_without_bias(kern):
    for t in _testers(kern):
        t.m(kern.mr).n(kern.nr + 1).k(5).bias(False).test()


@pytest.mark.parametrize("kern", PARAMS)
def test_tile_mismatch_and_bad_calls_are_refused(kern):
    t = GemmTester(kern).mr(kern.mr + 1)
    with pytest.raises(AssertionError, match=kern.name):
        t.test()
    with pytest.raises(ValueError, match="mr = "):
        GemmTester(kern).m(kern.mr + 1).test()
    with pytest.raises(ValueError, match="nc = 0"):
        GemmTester(kern).n(0).test()
    panels = np.zeros(_woq.packed_size(kern.nr, 4, kern.nr, kern.kr), np.int8)
    scale = np.zeros(kern.nr, np.float32)
    c = np.zeros((1, kern.nr), np.float32)
    taken = first_dtype(kern)
    wrong = np.float16 if taken.itemsize == 4 else np.float32
    with pytest.raises(ValueError, match="x: expected"):  # rows of another width
        _woq.ukernel(kern.index, 1, 1, 4, np.zeros((1, 4), wrong), dtype_code(taken), panels,
                     scale, None, c, c.strides[0])
    with pytest.raises(ValueError, match="dtype code 7"):
        _woq.ukernel(kern.index, 1, 1, 4, np.zeros((1, 4), np.float32), 7, panels, scale,
                     None, c, c.strides[0])
