"""An XNNPACK-style tester of one micro-kernel call, with no driver between.

    GemmTester(kern).m(3).n(17).k(5).a_stride(9).test()

packs a random int8 weight into the kernel's panels (widened, for a kernel
that reads widened panels, by ``qkern._woq.widen_weight`` or the ``widen``
given), calls the kernel once
through ``qkern._woq.ukernel`` (or the ``call`` given: an emulated build,
tests/emulated_kernels.py) on rows of ``x`` ``a_stride`` elements apart
(converted to float32 first, as the driver does, for a kernel that
converts x),
into a poisoned output whose rows are ``c_stride`` elements apart, and
checks every output element against the float64 reference
(tests/reference.py) and that nothing around the output was written.
``mr()``, ``nr()`` and ``kr()`` state the tile a sweep is written for and
must match the kernel's.
"""

import numpy as np

from qkern import _woq
from qkern._dtypes import dtype_code
from qkern.packing import aligned_empty
from reference import assert_woq_close

POISON = np.nan


def packed_panels(w, nr: int, kr: int):
    """An (n, k) int8 weight zero-padded to whole panels of ``nr`` columns
    and packed in the layout ``(nr, kr)``."""
    n, k = w.shape
    padded = np.zeros((-(-n // nr) * nr, k), np.int8)
    padded[:n] = w
    panels = np.empty(_woq.packed_size(padded.shape[0], k, nr, kr), np.int8)
    _woq.pack(padded, nr, kr, panels)
    return panels


def _woq_widened(kern, panels, n: int, k: int):
    """The packed (n, k) weight widened for ``kern`` by the compiled module."""
    wide = aligned_empty(_woq.widened_size(kern.index, n, k))
    _woq.widen_weight(kern.index, panels, n, k, wide.view(np.uint8))
    return wide


class GemmTester:
    """One call of a ``panels`` or ``unpacked`` kernel (see the module docstring)."""

    def __init__(self, kern, call=None, widen=None):
        self.kern = kern
        # call(mr, nc, kc, x, dtype, panels, scale, bias, c, c_stride): the
        # micro-kernel itself; by default the compiled one, qkern._woq.ukernel
        self._call = call or (lambda *args: _woq.ukernel(kern.index, *args))
        # widen(panels, n, k): the whole packed (n, k) weight widened
        self._widen = widen or (lambda panels, n, k: _woq_widened(kern, panels, n, k))
        self._tile = (kern.mr, kern.nr, kern.kr)
        self._m, self._n, self._k = kern.mr, kern.nr, max(kern.kr, 1)
        self._a_stride = self._c_stride = None
        self._dtype = np.dtype(np.float32)
        self._bias = True
        self._seed = 0

    def _set(self, name, value):
        setattr(self, name, value)
        return self

    def mr(self, v):
        """The kernel's MR, as the sweep expects it."""
        return self._set("_tile", (v,) + self._tile[1:])

    def nr(self, v):
        """The kernel's NR, as the sweep expects it."""
        return self._set("_tile", self._tile[:1] + (v,) + self._tile[2:])

    def kr(self, v):
        """The kernel's KR, as the sweep expects it."""
        return self._set("_tile", self._tile[:2] + (v,))

    def m(self, v):
        """Rows of x (1 .. MR)."""
        return self._set("_m", v)

    def n(self, v):
        """Columns (any number of panels, the last one partial)."""
        return self._set("_n", v)

    def k(self, v):
        """k values (any, 0 included)."""
        return self._set("_k", v)

    def a_stride(self, v):
        """Elements between rows of x (>= k; default k)."""
        return self._set("_a_stride", v)

    def c_stride(self, v):
        """Elements between rows of the output (>= n; default n)."""
        return self._set("_c_stride", v)

    def dtype(self, v):
        """Activation (and output) dtype."""
        return self._set("_dtype", np.dtype(v))

    def bias(self, v):
        """Whether to pass a bias."""
        return self._set("_bias", bool(v))

    def seed(self, v):
        """Random seed of the data."""
        return self._set("_seed", v)

    def test(self):
        """Run the call and check it; AssertionError on any difference."""
        kern, m, n, k = self.kern, self._m, self._n, self._k
        assert self._tile == (kern.mr, kern.nr, kern.kr), (self._tile, kern.name)
        a_stride, c_stride = self._a_stride or k, self._c_stride or n
        rng = np.random.default_rng(self._seed)
        x_rows = (rng.standard_normal((m, max(a_stride, 1))) * 4).astype(self._dtype)
        x = x_rows[:, :k]
        # a kernel that converts x reads the driver's exact f32 copy of it
        x_read = (x_rows.astype(np.float32) if kern.converts_x else x_rows)[:, :k]
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        s = rng.uniform(0.001, 0.02, n).astype(self._dtype)
        b = rng.standard_normal(n).astype(self._dtype) if self._bias else None
        n_padded = -(-n // kern.nr) * kern.nr
        panels = packed_panels(w, kern.nr, kern.kr)
        if kern.widened:
            panels = self._widen(panels, n_padded, k)
        scale = np.zeros(n_padded, np.float32)
        scale[:n] = s
        bias = None
        if b is not None:
            bias = np.zeros(n_padded, np.float32)
            bias[:n] = b
        big = np.full((m + 2, c_stride + 8), POISON, self._dtype)
        c = big[1:1 + m, 3:3 + c_stride]
        self._call(m, n, k, x_read, dtype_code(self._dtype), panels, scale, bias, c,
                   c.strides[0])
        y = c[:, :n]
        outside = big.astype(np.float64)
        outside[1:1 + m, 3:3 + n] = np.nan
        assert np.isnan(outside).all(), f"{kern.name} wrote outside its output"
        assert not np.isnan(y.astype(np.float64)).any(), f"{kern.name} left an output unwritten"
        assert_woq_close(y, x, w, s, b, daz=kern.flushes_subnormals,
                         planes=kern.planes(self._dtype))
