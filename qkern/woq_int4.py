"""int4 groupwise weight-only-quantized GEMM: quantizing, packing, checking, dispatch.

``y[..., n] = sum_k x[..., k] * ((q[n, k] - 8) * s[k // G, n] + z[k // G, n]) + bias[n]``
with 4-bit ``q`` in 0..15, a scale ``s`` and a zero ``z`` per group of ``G``
consecutive k and output column, fp32 sums in the order docs/int4.rst
fixes, and a single rounding to the dtype of ``x``.  The weight is packed
once, in one layout for every CPU (docs/kernels.rst, "Packed int4 layout").
"""

from __future__ import annotations

import math

import numpy as np

from qkern import _cpu, _woq, tuning
from qkern._dtypes import dtype_name
from qkern.dispatch import INT4, Blocking, Kernel, choose_kernel, get_kernel, runnable_here
from qkern.packing import aligned_empty, check_array, freeze
from qkern.woq import _check_threads, _check_vector, _padded_f32, run_rows

__all__ = ["GROUP_SIZES", "Int4Linear", "pack_int4", "quantize_int4", "unpack_int4",
           "weight_int4pack_mm"]

GROUP_SIZES = (32, 64, 128, 256)
_PANEL = 32  # columns per packed panel; 16 bytes per k of a panel


def _check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES}, got {group_size}")
    return int(group_size)


def _check_k(k: int, group_size: int) -> None:
    if k % group_size:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")


def quantize_int4(w, group_size: int):
    """Quantize a float weight to 4 bits per value, asymmetrically per group of K.

    Per output column ``n`` and group ``g`` of ``group_size`` consecutive k
    (the usual min/max rule, as gpt-fast and torchao use for
    ``torch._weight_int4pack_mm``), in float32::

        lo, hi = min(w[n, group]), max(w[n, group])
        scale  = max(hi - lo, 1e-6) / 15
        zero   = lo + 8 * scale
        q      = clip(round_half_even((w - lo) / scale), 0, 15)

    so that ``(q - 8) * scale + zero`` lies within ``scale / 2`` of ``w``
    (before ``scale`` and ``zero`` are rounded to ``w``'s dtype).

    Parameters
    ----------
    w : numpy.ndarray
        Shape ``(N, K)``, dtype float32, float16 or bfloat16, finite; ``K``
        a multiple of ``group_size``.
    group_size : int
        32, 64, 128 or 256.

    Returns
    -------
    q : numpy.ndarray
        uint8, shape ``(N, K)``, values 0..15 (for :func:`pack_int4`).
    scales_and_zeros : numpy.ndarray
        Shape ``(K // group_size, N, 2)``, dtype of ``w``: ``[g, n, 0]`` the
        scale, ``[g, n, 1]`` the zero.

    Examples
    --------
    >>> import numpy as np, qkern
    >>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    >>> q, sz = qkern.quantize_int4(w, 32)
    >>> q.shape, sz.shape, int(q.min()), int(q.max())
    ((1, 64), (2, 1, 2), 0, 15)
    """
    w = check_array("w", w, 2)
    dtype_name(w.dtype, "w")
    group_size = _check_group_size(group_size)
    n, k = w.shape
    _check_k(k, group_size)
    wf = w.astype(np.float32).reshape(n, k // group_size, group_size)
    if not np.isfinite(wf).all():
        raise ValueError("w: holds NaN or infinity, which have no int4 value")
    lo, hi = wf.min(axis=-1), wf.max(axis=-1)
    with np.errstate(over="ignore"):
        spans = hi - lo
    if not np.isfinite(spans).all():
        raise ValueError("w: a group spans more than float32's range (its max - min "
                         "overflows), which no int4 scale can hold")
    scale = np.maximum(spans, np.float32(1e-6)) / np.float32(15)
    zero = lo + np.float32(8) * scale
    q = np.clip(np.rint((wf - lo[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)
    scales_and_zeros = np.stack([scale.T, zero.T], axis=-1).astype(w.dtype)
    return q.reshape(n, k), np.ascontiguousarray(scales_and_zeros)


def _check_q(q) -> np.ndarray:
    q = check_array("q", q, 2)
    if not np.issubdtype(q.dtype, np.integer):
        raise TypeError(f"q: expected an integer dtype, got {q.dtype}")
    if q.size and (q.min() < 0 or q.max() > 15):
        raise ValueError(f"q: expected values 0..15, got {q.min()}..{q.max()}")
    return np.ascontiguousarray(q, dtype=np.uint8)


def pack_int4(q) -> np.ndarray:
    """Pack 4-bit values into qkern's int4 layout, the same on every CPU.

    Column ``n`` of panel ``p = n // 32`` holds, for each ``k``, the low
    nibble (``n % 32 < 16``) or the high nibble of byte ``n % 16`` of the
    panel's 16-byte row ``k`` (docs/kernels.rst draws it); columns past
    ``N`` in the last panel are zero.

    Parameters
    ----------
    q : numpy.ndarray
        Integer values 0..15, shape ``(N, K)`` (as :func:`quantize_int4`
        returns).

    Returns
    -------
    numpy.ndarray
        uint8, shape ``(ceil(N / 32), K, 16)``, C-contiguous and 64-byte
        aligned: ``N * K / 2`` bytes, plus the last panel's padding.

    Examples
    --------
    >>> import numpy as np, qkern
    >>> q = np.arange(64, dtype=np.uint8).reshape(2, 32) % 16
    >>> p = qkern.pack_int4(q)
    >>> p.shape
    (1, 32, 16)
    >>> bool((qkern.unpack_int4(p, 2) == q).all())
    True
    """
    q = _check_q(q)
    n, k = q.shape
    packed = aligned_empty(_woq.int4_packed_size(n, k)).view(np.uint8)
    _woq.pack_int4(q, packed)
    return packed.reshape(-(-n // _PANEL), k, 16)


def _check_packed(w_packed, n: int | None = None) -> np.ndarray:
    w_packed = check_array("w_packed", w_packed, 3)
    if w_packed.dtype != np.uint8:
        raise TypeError(f"w_packed: expected dtype uint8 (from qkern.pack_int4), "
                        f"got {w_packed.dtype}")
    if w_packed.shape[2] != 16 or not w_packed.flags.c_contiguous:
        raise ValueError(f"w_packed: expected a C-contiguous (ceil(N / 32), K, 16) array from "
                         f"qkern.pack_int4, got shape {w_packed.shape}")
    if n is not None and w_packed.shape[0] != -(-n // _PANEL):
        raise ValueError(f"w_packed: holds {w_packed.shape[0]} panels of 32 columns, "
                         f"N={n} needs {-(-n // _PANEL)}")
    return w_packed


def unpack_int4(w_packed, n: int) -> np.ndarray:
    """The ``(N, K)`` uint8 values 0..15 that :func:`pack_int4` packed.

    Parameters
    ----------
    w_packed : numpy.ndarray
        From :func:`pack_int4`.
    n : int
        ``N``, the number of columns packed.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TypeError(f"n: expected an int >= 0, got {n!r}")
    w_packed = _check_packed(w_packed, int(n))
    q = np.empty((int(n), w_packed.shape[1]), np.uint8)
    _woq.unpack_int4(w_packed.reshape(-1), q)
    return q


def _check_scales_and_zeros(sz, k: int, group_size: int, dtype) -> np.ndarray:
    """``sz`` checked against K, ``group_size`` and x's dtype, as given (not
    copied: an ``out`` is checked against the caller's memory)."""
    sz = check_array("scales_and_zeros", sz, 3)
    if sz.dtype != dtype:
        raise TypeError(f"scales_and_zeros: expected dtype {np.dtype(dtype)} (the dtype of x), "
                        f"got {sz.dtype}")
    if sz.shape[0] != k // group_size or sz.shape[2] != 2:
        raise ValueError(f"scales_and_zeros: expected shape (K // group_size, N, 2) = "
                         f"({k // group_size}, N, 2), got {sz.shape}")
    return sz


def _run(kern: Kernel, x, w_packed, n: int, k: int, group_size: int, sz, bias_f32, out,
         num_threads, inputs: tuple, blocking: Blocking | None = None):
    """Run int4 kernel ``kern`` over x (checked against (n, k)), cut as
    ``blocking`` says or by its default; the output array."""

    def launch(xs, rows, code, x_stride, offsets, y, y_stride, threads, cut):
        _woq.gemm_int4(kern.index, xs, rows, n, k, group_size, code, x_stride, offsets,
                       w_packed.reshape(-1), sz, bias_f32, y, y_stride, threads, cut)

    return run_rows(kern, x, n, k, out, num_threads, inputs, blocking, launch)


def weight_int4pack_mm(x, w_packed, group_size, scales_and_zeros, *, bias=None, out=None,
                       num_threads=None):
    """Matrix product of activations with 4-bit weights scaled per group of K.

    ``y[..., n] = sum_k x[..., k] * ((q[n, k] - 8) * s[g, n] + z[g, n]) + bias[n]``,
    ``g = k // group_size``, fp32 sums (in the order docs/int4.rst fixes)
    rounded once to the dtype of ``x``. The semantics of
    ``torch._weight_int4pack_mm_for_cpu``, on qkern's own packed layout.

    Parameters
    ----------
    x : numpy.ndarray
        Activations, shape ``(..., K)``, dtype float32, float16 or
        ``ml_dtypes.bfloat16``; any strides (copied only when the last axis
        is not unit-stride).
    w_packed : numpy.ndarray
        From :func:`pack_int4`: uint8, shape ``(ceil(N / 32), K, 16)``.
    group_size : int
        32, 64, 128 or 256, dividing ``K``.
    scales_and_zeros : numpy.ndarray
        Shape ``(K // group_size, N, 2)``, dtype of ``x``: scale at
        ``[..., 0]``, zero at ``[..., 1]`` (copied if not C-contiguous).
    bias : numpy.ndarray, optional
        Shape ``(N,)``, dtype of ``x``.
    out : numpy.ndarray, optional
        Destination, shape ``(..., N)``, dtype of ``x``, unit stride along the
        last axis, not overlapping any input.
    num_threads : int, optional
        As for :func:`qkern.weight_int8pack_mm`; results are bitwise
        identical for every value.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., N)``, dtype of ``x`` (``out`` when given).

    Examples
    --------
    >>> import numpy as np, qkern
    >>> w = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    >>> q, sz = qkern.quantize_int4(w, 32)
    >>> y = qkern.weight_int4pack_mm(np.ones((1, 64), np.float32), qkern.pack_int4(q), 32, sz)
    >>> y.shape, bool(np.allclose(y, w.sum(axis=1), atol=0.2))
    ((1, 2), True)
    """
    x = check_array("x", x)
    dtype_name(x.dtype)
    group_size = _check_group_size(group_size)
    w_packed = _check_packed(w_packed)
    k = w_packed.shape[1]
    _check_k(k, group_size)
    sz_given = _check_scales_and_zeros(scales_and_zeros, k, group_size, x.dtype)
    sz = np.ascontiguousarray(sz_given)
    n = sz.shape[1]
    _check_packed(w_packed, n)
    if bias is not None:
        bias = _check_vector("bias", bias, n, x.dtype)
    m = math.prod(x.shape[:-1]) if x.ndim else 0
    kern = choose_kernel(x.dtype, m, weight_format=INT4, n=n)
    inputs = (("w_packed", w_packed), ("scales_and_zeros", sz_given), ("bias", bias))
    return _run(kern, x, w_packed, n, k, group_size, sz, _padded_f32(bias, _PANEL), out,
                num_threads, inputs)


class Int4Linear:
    """A linear layer with 4-bit groupwise weights, packed once.

    ``y = x @ W.T + bias`` with ``W[n, k] = (q[n, k] - 8) * s[g, n] + z[g, n]``
    (:func:`weight_int4pack_mm`). Holds one packed copy of the weight
    (``N * K / 2`` bytes) and its scales and zeros.

    Parameters
    ----------
    w_packed : numpy.ndarray
        From :func:`pack_int4` (copied).
    group_size : int
        32, 64, 128 or 256.
    scales_and_zeros : numpy.ndarray
        Shape ``(K // group_size, N, 2)``; its dtype (float32, float16 or
        bfloat16) is the activation dtype this layer accepts.
    bias : numpy.ndarray, optional
        Shape ``(N,)``, dtype of ``scales_and_zeros``.
    kernel : str, optional
        Force one int4 registry kernel (see :func:`qkern.kernels`).

    Examples
    --------
    >>> import numpy as np, qkern
    >>> w = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64)
    >>> layer = qkern.Int4Linear.from_float(w, group_size=64)
    >>> layer.shape, layer(np.ones(64, np.float32)).shape
    ((3, 64), (3,))
    """

    def __init__(self, w_packed, group_size, scales_and_zeros, bias=None, *,
                 kernel: str | None = None):
        self.group_size = _check_group_size(group_size)
        w_packed = _check_packed(w_packed)
        k = w_packed.shape[1]
        _check_k(k, self.group_size)
        sz = check_array("scales_and_zeros", scales_and_zeros, 3)
        self.dtype = np.dtype(sz.dtype)
        dtype_name(self.dtype, "scales_and_zeros")
        sz = _check_scales_and_zeros(sz, k, self.group_size, self.dtype)
        n = sz.shape[1]
        _check_packed(w_packed, n)
        if bias is not None:
            bias = _check_vector("bias", bias, n, self.dtype)
        self._forced = get_kernel(kernel) if kernel is not None else None
        if self._forced is not None and (self._forced.weight_format != INT4
                                         or dtype_name(self.dtype) not in self._forced.dtypes):
            raise ValueError(f"kernel {kernel!r} does not read int4 weights with "
                             f"dtype {dtype_name(self.dtype)}")
        self._shape = (n, k)
        self._packed = aligned_empty(w_packed.nbytes).view(np.uint8).reshape(w_packed.shape)
        self._packed[...] = w_packed
        self._packed = freeze(self._packed)
        self._sz = freeze(sz.copy())
        self._bias = None if bias is None else freeze(bias.copy())
        self._bias_f32 = _padded_f32(bias, _PANEL)

    @classmethod
    def from_float(cls, w, group_size: int, bias=None, **kwargs) -> Int4Linear:
        """The layer of ``w`` (``(N, K)``, float32, float16 or bfloat16)
        quantized by :func:`quantize_int4`; ``bias`` and ``kernel`` as for
        the constructor. The layer's dtype is ``w``'s."""
        q, sz = quantize_int4(w, group_size)
        return cls(pack_int4(q), group_size, sz, bias, **kwargs)

    @property
    def shape(self) -> tuple:
        """``(N, K)``."""
        return self._shape

    @property
    def packed_weight(self) -> np.ndarray:
        """The packed weight (a read-only view, :func:`pack_int4`'s layout)."""
        return self._packed

    @property
    def scales_and_zeros(self) -> np.ndarray:
        """``(K // group_size, N, 2)``, dtype :attr:`dtype` (a read-only view)."""
        return self._sz

    @property
    def bias(self) -> np.ndarray | None:
        """The bias, shape ``(N,)``, dtype :attr:`dtype` (a read-only view), or None."""
        return self._bias

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed weight, scales and zeros, and the bias (in both forms)."""
        held = [self._packed, self._sz, self._bias, self._bias_f32]
        return sum(a.nbytes for a in held if a is not None)

    def weight(self) -> np.ndarray:
        """The ``(N, K)`` uint8 values 0..15, unpacked (a new array)."""
        return unpack_int4(self._packed, self._shape[0])

    def kernel_for(self, m: int, num_threads=None) -> Kernel:
        """The kernel a call with ``m`` rows of activations (and
        ``num_threads``) runs: the forced one, else the tuned one under
        ``QKERN_AUTOTUNE=1`` (:mod:`qkern.tuning`), else the static rule's."""
        return self._plan(m, num_threads)[0]

    def _plan(self, m: int, num_threads) -> tuple:
        """``(kernel, blocking, num_threads)`` of a call with ``m`` rows."""
        if self._forced is not None:
            return self._forced, None, num_threads
        if tuning.autotune_enabled() and m > 0:
            threads = _cpu.threads_for_call(_check_threads(num_threads))
            n, k = self._shape
            choice = tuning.choice_for(self.dtype, m, n, k, threads,
                                       group_size=self.group_size)
            return get_kernel(choice.kernel), choice.blocking, choice.threads
        return (choose_kernel(self.dtype, m, weight_format=INT4, n=self._shape[0]), None,
                num_threads)

    def __call__(self, x, *, out=None, num_threads=None):
        """Apply the layer to ``x`` of shape ``(..., K)`` and dtype :attr:`dtype`;
        ``out`` and ``num_threads`` as in :func:`weight_int4pack_mm`."""
        x = check_array("x", x)
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype} (the dtype of scales_and_zeros), "
                            f"got {x.dtype}")
        m = math.prod(x.shape[:-1]) if x.ndim else 0
        n, k = self._shape
        kern, blocking, num_threads = self._plan(m, num_threads)
        return _run(kern, x, self._packed, n, k, self.group_size, self._sz, self._bias_f32,
                    out, num_threads, (), blocking)

    def __getstate__(self) -> dict:
        """The layer as pickled: packed weight, group size, scales and zeros, bias, kernel."""
        return {"w_packed": self._packed, "group_size": self.group_size,
                "scales_and_zeros": self._sz, "bias": self._bias,
                "kernel": self._forced.name if self._forced else None}

    def __setstate__(self, state: dict) -> None:
        """Rebuild the layer from :meth:`__getstate__`'s dict, checked as the
        constructor checks its arguments (a forced kernel this machine cannot
        run gives way to the automatic choice)."""
        keys = {"w_packed", "group_size", "scales_and_zeros", "bias", "kernel"}
        if not isinstance(state, dict) or set(state) != keys:
            raise TypeError(f"Int4Linear state: expected a dict with the keys {sorted(keys)}, "
                            f"got {state!r:.200}")
        self.__init__(state["w_packed"], state["group_size"], state["scales_and_zeros"],
                      state["bias"], kernel=runnable_here(state["kernel"]))

    def __repr__(self) -> str:
        n, k = self._shape
        return (f"Int4Linear(N={n}, K={k}, group_size={self.group_size}, "
                f"dtype={dtype_name(self.dtype)}, bias={self._bias is not None})")
