"""int8 weight-only-quantized GEMM: argument checking, packing, dispatch.

``y[..., n] = (sum_k x[..., k] * w[n, k]) * scales[n] + bias[n]`` with fp32
accumulation and a single rounding to the dtype of ``x`` (docs/semantics.rst).
"""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np

from qkern import _cpu, _woq, tuning
from qkern._dtypes import dtype_code, dtype_name
from qkern.dispatch import (
    INT8,
    Blocking,
    Kernel,
    choose_kernel,
    choose_layout,
    get_kernel,
    runnable_here,
    widened_copy_fits,
)
from qkern.packing import PackedWeight, check_array, check_int8_weight, freeze

__all__ = ["weight_int8pack_mm", "WoqLinear"]



def _check_vector(name: str, v, n: int, dtype) -> np.ndarray:
    v = check_array(name, v, 1)
    if v.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)} (the dtype of x), got {v.dtype}")
    if v.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) to match w's N, got {v.shape}")
    return v


def _padded_f32(v: np.ndarray | None, nr: int) -> np.ndarray | None:
    if v is None:
        return None
    n = v.shape[0]
    out = np.zeros(-(-n // nr) * nr if n else nr, dtype=np.float32)
    out[:n] = v
    return out


def _row_stride(shape: tuple, strides: tuple):
    """Stride s with row i (C order over ``shape``) at byte i*s, or None."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    return dims[-1][1] if dims else 0


def _x_rows(x: np.ndarray):
    """(row stride or 0, row offsets or None) addressing the rows of x in place."""
    lead_shape, lead_strides = x.shape[:-1], x.strides[:-1]
    stride = _row_stride(lead_shape, lead_strides)
    if stride is not None:
        return stride, None
    offsets = np.zeros(lead_shape, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(lead_shape, lead_strides)):
        shape = [1] * len(lead_shape)
        shape[axis] = n
        offsets += (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return 0, offsets.ravel()


# A copy of x is made in blocks of rows of at most this many bytes, or of the
# bytes x spans where that is more (docs/semantics.rst, "Strides and copies").
_COPY_BLOCK_BYTES = 4 << 20


def _span_bytes(x: np.ndarray) -> int:
    """Bytes from the lowest to the highest address of x's elements."""
    return x.itemsize + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.strides))


def _x_copies(x: np.ndarray):
    """x itself when its rows can be read in place; otherwise a copy of it.

    Yields ``(first row, rows, array)`` covering x's rows in order.  x is
    copied only when its last axis is not unit-stride: whole, if its distinct
    rows (axes of stride 0 stay broadcast) fit in the block size, or x is one
    row; else in blocks of rows, so that no copy outgrows the larger of the
    block size and the memory x spans (or one row).
    """
    m = math.prod(x.shape[:-1])
    if x.shape[-1] <= 1 or x.strides[-1] == x.itemsize:
        yield 0, m, x
        return
    distinct = x[tuple(slice(0, 1) if s == 0 else slice(None) for s in x.strides[:-1])]
    budget = max(_COPY_BLOCK_BYTES, _span_bytes(x))
    if distinct.size * x.itemsize <= budget or m == 1:
        yield 0, m, np.broadcast_to(np.ascontiguousarray(distinct), x.shape)
        return
    rows = max(1, budget // (x.shape[-1] * x.itemsize))
    for r0 in range(0, m, rows):
        index = np.unravel_index(np.arange(r0, min(r0 + rows, m)), x.shape[:-1])
        yield r0, len(index[0]), np.ascontiguousarray(x[index])


_THREAD_NOTICES = {
    "forked": "qkern: this process was forked after qkern ran OpenMP threads, whose pool "
              "does not survive fork; calls here run on one thread (docs/reliability.rst)",
    "os_refused": "qkern: the OS could not start all the threads a call asked for; it ran on "
                  "those that started (docs/reliability.rst)",
}


def _warn_thread_notices():
    """Warn of what the last call's threads met, at the caller of the public
    function (which calls a ``_run`` helper, which calls :func:`run_rows`)."""
    for notice in sorted(_cpu.take_thread_notice()):
        warnings.warn(_THREAD_NOTICES[notice], RuntimeWarning, stacklevel=5)


def _check_out(out, shape: tuple, dtype, inputs: tuple):
    out = check_array("out", out)
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if out.dtype != dtype:
        raise TypeError(f"out: expected dtype {np.dtype(dtype)} (the dtype of x), got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out: the array is read-only")
    if out.size == 0:  # nothing is written: any strides will do, as for NumPy
        return out, 0
    stride = _row_stride(shape[:-1], out.strides[:-1])
    if (shape[-1] > 1 and out.strides[-1] != out.itemsize) or stride is None:
        raise ValueError("out: expected unit stride along the last axis and rows one "
                         f"stride apart, got strides {out.strides}")
    if out.size > shape[-1] and abs(stride) < shape[-1] * out.itemsize:
        raise ValueError(f"out: rows overlap each other (strides {out.strides})")
    for name, a in inputs:
        if a is not None and np.shares_memory(out, a):
            raise ValueError(f"out: overlaps {name}")
    return out, stride


_MAX_THREADS = 2**31 - 1  # a C int


def _check_threads(num_threads, arg: str = "num_threads") -> int:
    """A thread count as the C driver takes it: 0 for None (the default)."""
    if num_threads is None:
        return 0
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)):
        raise TypeError(f"{arg}: expected an int or None, got {type(num_threads).__name__}")
    if not 1 <= num_threads <= _MAX_THREADS:
        raise ValueError(f"{arg}: expected 1 to {_MAX_THREADS}, got {num_threads}")
    return int(num_threads)


def _run(kern: Kernel, x, w_packed, w_layout: tuple, n: int, k: int, scale_f32, bias_f32, out,
         num_threads, inputs: tuple, blocking: Blocking | None = None, widened=None):
    """Validate x/out against (n, k) and the weight's layout tag against
    ``kern``, and run int8 kernel ``kern`` (cut as ``blocking`` says, or by
    its default) on ``w_packed``, or on ``widened`` (the weight widened
    beforehand for ``kern``) when given; returns the output array."""
    if w_layout != kern.layout:
        raise ValueError(f"packed weight: layout {w_layout} is not the {kern.layout} that "
                         f"{kern.name} reads")
    weight = w_packed if widened is None else widened

    def launch(xs, rows, code, x_stride, offsets, y, y_stride, threads, cut):
        _woq.gemm(kern.index, xs, rows, n, k, code, x_stride, offsets, weight, scale_f32,
                  bias_f32, y, y_stride, threads, cut, widened is not None)

    return run_rows(kern, x, n, k, out, num_threads, inputs, blocking, launch)


def run_rows(kern: Kernel, x, n: int, k: int, out, num_threads, inputs: tuple,
             blocking: Blocking | None, launch):
    """Validate x/out against (n, k), allocate the output, and run ``kern``
    over x's rows in place (or over blocks of a copy, :func:`_x_copies`)
    through ``launch(xs, rows, dtype code, x_stride, offsets, y, y_stride,
    threads, blocking tuple)``, which calls the C entry; returns the output
    array.  ``inputs``: ``(name, array)`` pairs ``out`` must not overlap."""
    x = check_array("x", x)
    if x.ndim < 1:
        raise ValueError("x: expected shape (..., K), got a 0-d array")
    if x.shape[-1] != k:
        raise ValueError(f"x: expected last dimension K={k} (from w), got shape {x.shape}")
    code = dtype_code(x.dtype)
    if blocking is not None and not isinstance(blocking, Blocking):
        raise TypeError(f"blocking: expected a qkern.dispatch.Blocking or None, "
                        f"got {type(blocking).__name__}")
    cut = None if blocking is None else blocking.check(kern.kind, kern.packs_x).to_driver()
    threads = _cpu.threads_for_call(_check_threads(num_threads))
    shape = x.shape[:-1] + (n,)
    if out is None:
        y, y_stride = np.empty(shape, dtype=x.dtype), n * x.itemsize
    else:
        y, y_stride = _check_out(out, shape, x.dtype, (("x", x),) + inputs)
    m = math.prod(x.shape[:-1])
    if m == 0 or n == 0:
        return y
    for r0, rows, xs in _x_copies(x):
        x_stride, offsets = _x_rows(xs)
        y_r0 = y if r0 == 0 else np.lib.stride_tricks.as_strided(y, (m, n),
                                                                 (y_stride, y.itemsize))[r0:]
        launch(xs, rows, code, x_stride, offsets, y_r0, y_stride, threads, cut)
        del xs  # a block copy is freed before the next is made
    _warn_thread_notices()
    return y


def weight_int8pack_mm(x, w, scales, *, bias=None, out=None, num_threads=None):
    """Matrix product of activations with int8 weights scaled per output channel.

    ``y[..., n] = (sum_k f32(x[..., k]) * f32(w[n, k])) * f32(scales[n]) + f32(bias[n])``,
    accumulated in fp32 and rounded once to the dtype of ``x``. Same semantics as
    ``torch._weight_int8pack_mm`` (which has no ``bias``).

    Parameters
    ----------
    x : numpy.ndarray
        Activations, shape ``(..., K)``, dtype float32, float16 or
        ``ml_dtypes.bfloat16``; any strides (copied only when the last axis
        is not unit-stride).
    w : numpy.ndarray
        int8 weights, shape ``(N, K)``, C-contiguous.
    scales : numpy.ndarray
        Per-output-channel scales, shape ``(N,)``, dtype of ``x``.
    bias : numpy.ndarray, optional
        Shape ``(N,)``, dtype of ``x``.
    out : numpy.ndarray, optional
        Destination, shape ``(..., N)``, dtype of ``x``, unit stride along the
        last axis, not overlapping any input.
    num_threads : int, optional
        OpenMP threads; default: the OpenMP setting (``threadpoolctl`` limits
        apply). Capped at the processors this process may run on, and at
        one in a child forked after qkern ran threads (docs: "Threads").
        Results are bitwise identical for every value.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., N)``, dtype of ``x`` (``out`` when given).

    Notes
    -----
    For a few rows (``M`` up to ``qkern.dispatch.UNPACKED_CALLS`` times the
    MR of the highest level's unpacked-weight SIMD kernel: 24 for
    ``f32_gemv_8x1c0__avx512`` and ``bf16_gemv_8x1c0__avx512bf16``, 32 for
    ``f32_gemv_8x1c0__avx2``, 128 for ``bf16_gemv_32x1c0__amx`` on an AMX
    CPU) the weight is read as it is;
    otherwise it is packed on every call. :class:`WoqLinear` packs it
    once.

    Examples
    --------
    >>> import numpy as np, qkern
    >>> x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    >>> w = np.array([[1, 0, -1], [2, 2, 2]], dtype=np.int8)
    >>> qkern.weight_int8pack_mm(x, w, np.array([0.5, 1.0], dtype=np.float32))
    array([[-1., 12.]], dtype=float32)
    """
    x = check_array("x", x)
    dtype_name(x.dtype)
    w = check_int8_weight(w)
    n, k = w.shape
    scales = _check_vector("scales", scales, n, x.dtype)
    if bias is not None:
        bias = _check_vector("bias", bias, n, x.dtype)
    m = math.prod(x.shape[:-1]) if x.ndim else 0
    kern = choose_kernel(x.dtype, m, unpacked_ok=True, n=n)
    w_packed = w.reshape(-1) if kern.kind == "unpacked" else PackedWeight(w, kern.layout).data
    return _run(kern, x, w_packed, kern.layout, n, k, _padded_f32(scales, kern.nr),
                _padded_f32(bias, kern.nr), out, num_threads,
                (("w", w), ("scales", scales), ("bias", bias)))


class WoqLinear:
    """A linear layer with int8 weights packed once, ``y = x @ (w * scales).T + bias``.

    Holds one packed copy of the weight (a
    :class:`~qkern.packing.PackedWeight`), in the layout of the kernels
    chosen for this CPU; the caller's ``w`` is not kept. With a
    ``memory_budget`` it may also hold one copy widened beforehand, made on
    the first call that runs on it: a tuned choice under
    ``QKERN_AUTOTUNE=1``, or a forced kernel that reads one (:doc:`/tuning`);
    it keeps that copy, and a tuned choice of another kernel that reads a
    copy widens per chunk instead, as without one (the same bits).

    Parameters
    ----------
    w : numpy.ndarray or qkern.packing.PackedWeight
        int8, shape ``(N, K)``, C-contiguous; or a weight packed already
        (kept as it is when its layout is this layer's, repacked otherwise).
    scales : numpy.ndarray
        Shape ``(N,)``; its dtype (float32, float16 or bfloat16) is the
        activation dtype this layer accepts.
    bias : numpy.ndarray, optional
        Shape ``(N,)``, dtype of ``scales``.
    kernel : str, optional
        Force one registry kernel (see :func:`qkern.kernels`), for testing
        and benchmarking; default: chosen per call from the batch size.
    memory_budget : int, optional
        Bytes this layer may spend on one copy of the weight widened
        beforehand (4 bytes a value for the ``f32w`` kernels): made when
        the tuner finds a kernel faster on it (:func:`qkern.tuning.widened_ok`),
        or for a forced kernel that reads widened panels, if it fits;
        default 0: the packed weight only.

    Examples
    --------
    >>> import numpy as np, qkern
    >>> w = np.array([[1, 0, -1], [2, 2, 2]], dtype=np.int8)
    >>> layer = qkern.WoqLinear(w, np.array([0.5, 1.0], dtype=np.float32))
    >>> layer(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    array([-1., 12.], dtype=float32)
    >>> layer.shape
    (2, 3)
    """

    def __init__(self, w, scales, bias=None, *, kernel: str | None = None,
                 memory_budget: int = 0):
        if not isinstance(w, PackedWeight):
            w = check_int8_weight(w)
        n, k = w.shape
        scales = check_array("scales", scales, 1)
        self.dtype = np.dtype(scales.dtype)
        dtype_name(self.dtype, "scales")
        scales = _check_vector("scales", scales, n, self.dtype)
        if bias is not None:
            bias = _check_vector("bias", bias, n, self.dtype)
        self._forced = get_kernel(kernel) if kernel is not None else None
        if self._forced is not None and self._forced.weight_format != INT8:
            raise ValueError(f"kernel {kernel!r} reads {self._forced.weight_format} weights, "
                             "not int8 (qkern.Int4Linear runs the int4 kernels)")
        if self._forced is not None and dtype_name(self.dtype) not in self._forced.dtypes:
            raise ValueError(f"kernel {kernel!r} does not accept dtype {dtype_name(self.dtype)}")
        layout = self._forced.layout if self._forced else choose_layout(self.dtype)
        self._weight = (w.repacked(layout) if isinstance(w, PackedWeight)
                        else PackedWeight(w, layout))
        self._scales = freeze(scales.copy())
        self._bias = None if bias is None else freeze(bias.copy())
        self._scale_f32 = _padded_f32(scales, layout[0])
        self._bias_f32 = _padded_f32(bias, layout[0])
        self._memory_budget = tuning.check_memory_budget(memory_budget)
        # a forced kernel runs on a widened copy whenever one fits
        self._forced_on_copy = self._forced is not None and self._copy_fits(self._forced)
        self._widened = None  # (kernel name, the weight widened for it), made on use
        self._widened_lock = threading.Lock()

    @property
    def shape(self) -> tuple:
        """``(N, K)``."""
        return self._weight.shape

    @property
    def layout(self) -> tuple:
        """The packed layout ``(nr, kr)`` of the weight and of the kernels that read it."""
        return self._weight.layout

    @property
    def packed_weight(self) -> PackedWeight:
        """The packed weight this layer holds."""
        return self._weight

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed weight, any widened copy (:attr:`widened_nbytes`),
        scales and bias (in both forms)."""
        held = [self._scales, self._bias, self._scale_f32, self._bias_f32]
        return (self._weight.nbytes + self.widened_nbytes
                + sum(a.nbytes for a in held if a is not None))

    @property
    def widened_nbytes(self) -> int:
        """Bytes of the copy of the weight widened beforehand (0 while there is none)."""
        with self._widened_lock:
            return 0 if self._widened is None else self._widened[1].nbytes

    @property
    def memory_budget(self) -> int:
        """Bytes this layer may spend on a widened copy of its weight."""
        return self._memory_budget

    @property
    def scales(self) -> np.ndarray:
        """The per-channel scales, shape ``(N,)``, dtype :attr:`dtype` (a read-only view)."""
        return self._scales

    @property
    def bias(self) -> np.ndarray | None:
        """The bias, shape ``(N,)``, dtype :attr:`dtype` (a read-only view), or None."""
        return self._bias

    def kernel_for(self, m: int, num_threads=None) -> Kernel:
        """The kernel a call with ``m`` rows of activations (and
        ``num_threads``, as in :meth:`__call__`) runs: the forced one, else
        the tuned one under ``QKERN_AUTOTUNE=1`` (:mod:`qkern.tuning`, tuned
        now if new), else the static rule's."""
        return self._plan(m, num_threads, None)[0]

    def _plan(self, m: int, num_threads, blocking) -> tuple:
        """``(kernel, blocking, num_threads, on a widened copy)`` of a call
        with ``m`` rows."""
        if self._forced is not None:
            return self._forced, blocking, num_threads, self._forced_on_copy
        if tuning.autotune_enabled() and blocking is None and m > 0:
            threads = _cpu.threads_for_call(_check_threads(num_threads))
            n, k = self.shape
            choice = tuning.choice_for(self.dtype, m, n, k, threads, self.layout,
                                       memory_budget=self._memory_budget)
            kern = get_kernel(choice.kernel)
            widened = choice.weight_form == "widened" and self._copy_fits(kern)
            return kern, choice.blocking, choice.threads, widened
        return (choose_kernel(self.dtype, m, self.layout, n=self.shape[0]), blocking, num_threads,
                False)

    def _copy_fits(self, kern: Kernel) -> bool:
        """Whether ``kern`` runs on a widened copy that fits the budget."""
        return widened_copy_fits(kern, *self.shape, self._memory_budget)

    def _widened_copy(self, kern: Kernel) -> np.ndarray | None:
        """The weight widened for ``kern``, made on first use, or None where
        the layer holds the copy of another kernel: it keeps the first copy
        it makes (never two, nor a rebuild per call when tuned choices of
        two kernels alternate), and ``kern`` then widens per chunk as it
        does without a copy (the same bits)."""
        with self._widened_lock:
            if self._widened is None:
                self._widened = (kern.name, self._weight.widened(kern))
            return self._widened[1] if self._widened[0] == kern.name else None

    def weight(self) -> np.ndarray:
        """The int8 ``(N, K)`` weight, unpacked (a new array)."""
        return self._weight.unpack()

    def __call__(self, x, *, out=None, num_threads=None, blocking=None):
        """Apply the layer to ``x`` of shape ``(..., K)`` and dtype :attr:`dtype`.

        ``out`` and ``num_threads`` are as in :func:`weight_int8pack_mm`.
        ``blocking`` (a :class:`qkern.dispatch.Blocking`) cuts the call
        other than the kernel's default (:attr:`Kernel.blocking`), for
        tuning; every valid blocking gives the same bits, and one the
        kernel cannot take raises :class:`ValueError`.
        """
        x = check_array("x", x)
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype} (the dtype of scales), got {x.dtype}")
        m = math.prod(x.shape[:-1]) if x.ndim else 0
        n, k = self.shape
        kern, blocking, num_threads, widened = self._plan(m, num_threads, blocking)
        return _run(kern, x, self._weight.data, self._weight.layout, n, k,
                    self._scale_f32, self._bias_f32, out, num_threads, (), blocking,
                    self._widened_copy(kern) if widened and m and n else None)

    def __getstate__(self) -> dict:
        """The layer as pickled: its packed weight, scales, bias, forced
        kernel and memory budget (not a widened copy: it is made again on
        use)."""
        return {"weight": self._weight, "scales": self._scales, "bias": self._bias,
                "kernel": self._forced.name if self._forced else None,
                "memory_budget": self._memory_budget}

    def __setstate__(self, state: dict) -> None:
        """Rebuild the layer from :meth:`__getstate__`'s dict, checked as the
        constructor checks its arguments (the packed weight checked itself
        when it was unpickled), and repacked only if this machine's kernels
        read another layout (a forced kernel this machine cannot run gives
        way to the automatic choice). Nothing from the state reaches a
        kernel unchecked."""
        keys = {"weight", "scales", "bias", "kernel"}
        if not isinstance(state, dict) or set(state) - {"memory_budget"} != keys:
            raise TypeError("WoqLinear state: expected a dict with the keys weight, scales, "
                            f"bias, kernel (and memory_budget), got {state!r:.200}")
        self.__init__(state["weight"], state["scales"], state["bias"],
                      kernel=runnable_here(state["kernel"]),
                      memory_budget=state.get("memory_budget", 0))

    def __repr__(self) -> str:
        n, k = self.shape
        return (f"WoqLinear(N={n}, K={k}, dtype={dtype_name(self.dtype)}, "
                f"bias={self._bias is not None}, layout=nr{self.layout[0]}c{self.layout[1]})")
