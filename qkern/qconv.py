"""Fused int8 conv2d: argument checking, then the CPU path or the cuDNN path.

NumPy arrays run on the CPU (:mod:`qkern._conv_cpu`); CUDA arrays (anything
with ``__cuda_array_interface__`` or ``__dlpack__`` that is not a NumPy
array) run one cuDNN graph (:mod:`qkern.cudnn`), imported only then.  Both
compute docs/qconv2d.rst's semantics from the same fp32 constants
(:func:`qkern._conv_spec.epilogue_constants`).

The argument helpers of that shared spec that layers above qkern (such as
:mod:`qkern.torch`) call too are public here: :func:`as_float`,
:func:`pair`, :func:`padding_pairs`, :func:`geometry` and
:func:`epilogue_constants`.
"""

from __future__ import annotations

import numpy as np

from qkern import _conv_cpu
from qkern._conv_spec import as_float, epilogue_constants, geometry, padding_pairs, pair

__all__ = ["as_float", "epilogue_constants", "geometry", "pair", "padding_pairs", "qconv2d"]


def _is_device_array(a) -> bool:
    return not isinstance(a, np.ndarray) and (
        hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__"))


def _check_int8(name: str, a, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray (or, with x on the GPU, a CUDA array), "
                        f"got {type(a).__name__}")
    if a.dtype != np.int8:
        raise TypeError(f"{name}: expected dtype int8, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    return a


def _check_out(out, shape: tuple, inputs: tuple) -> np.ndarray:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy.ndarray for NumPy input, got {type(out).__name__}")
    if out.dtype != np.int8:
        raise TypeError(f"out: expected dtype int8, got {out.dtype}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out: the array is read-only")
    for name, a in inputs:
        if np.shares_memory(out, a):
            raise ValueError(f"out: overlaps {name}")
    return out


def qconv2d(x, w, bias=None, *, act_scale, weight_scale, out_scale, stride=1, padding=0,
            dilation=1, groups=1, relu=False, out=None, stream=None):
    """Quantized 2-D convolution with fused bias, ReLU and requantization to int8.

    For every output element (image ``n``, pixel ``(i, j)``, channel ``o``)::

        acc = sum over (kh, kw, c) of x[n, ...] * w[o, kh, kw, c]    (exact integer)
        v   = f32(acc) + bias'[o]          bias' = bias[o] / (act_scale * weight_scale[o])
        v   = max(v, 0)                    (when relu)
        y   = saturate_int8(round(v * m[o]))    m = act_scale * weight_scale[o] / out_scale

    with the fp32 constants ``bias'`` and ``m`` folded on the host (see
    :doc:`/qconv2d` for the exact order of operations and the rounding).

    Parameters
    ----------
    x : numpy.ndarray or CUDA array
        int8 activations, NHWC ``(N, H, W, C)``. A NumPy array runs on the
        CPU; an object with ``__cuda_array_interface__`` or ``__dlpack__``
        (CuPy, PyTorch, cuda.core) runs through cuDNN (needs
        ``pip install qkern[cuda]``).
    w : numpy.ndarray or CUDA array
        int8 weights, OHWI ``(O, kh, kw, C/groups)``. On the GPU path it may
        be a host or a device array.
    bias : numpy.ndarray, optional
        float32 ``(O,)``, in the real (dequantized) units of the output.
    act_scale, out_scale : float
        Scales of ``x`` and of the result (positive).
    weight_scale : float or numpy.ndarray
        A float (per-tensor) or a float32 ``(O,)`` array (per-channel).
    stride, dilation : int or (int, int)
        Vertical and horizontal.
    padding : int, (int, int) or ((int, int), (int, int))
        Zero padding: the same on every side, ``(ph, pw)`` on both sides of
        each axis, or ``((top, bottom), (left, right))``.
    groups : int
        Grouped convolution; ``groups`` divides ``C`` and ``O``.
    relu : bool
        Apply ``max(v, 0)`` before requantizing.
    out : array, optional
        Destination: an int8 ``(N, OH, OW, O)`` array of the same kind as
        ``x`` (NumPy: any strides; CUDA: dense NHWC), not overlapping the
        inputs.
    stream : optional
        GPU path only: a ``cuda.core.Stream``, an object with
        ``__cuda_stream__`` (CuPy, PyTorch streams) or a raw ``cudaStream_t``
        handle (int). Default: the current device's default stream.

    Returns
    -------
    numpy.ndarray or qkern.cudnn.DeviceArray
        int8 ``(N, OH, OW, O)`` (``out`` when given). On the GPU, an array
        exporting ``__cuda_array_interface__`` (v3) and ``__dlpack__``.

    Notes
    -----
    The CPU path accumulates exactly (BLAS over im2col patches, in float32
    when ``kh * kw * C/groups <= 1024`` and float64 otherwise) and rounds
    half to even. :class:`qkern.cudnn.QConv2d` keeps the weights on the
    device and the plans cached between calls.

    Examples
    --------
    >>> import numpy as np, qkern
    >>> x = np.arange(1, 10, dtype=np.int8).reshape(1, 3, 3, 1)
    >>> w = np.ones((1, 2, 2, 1), dtype=np.int8)
    >>> y = qkern.qconv2d(x, w, act_scale=0.5, weight_scale=0.5, out_scale=1.0)
    >>> y[0, :, :, 0]          # (1+2+4+5) * 0.25 = 3, 16 * 0.25 = 4, ...
    array([[3, 4],
           [6, 7]], dtype=int8)
    """
    if _is_device_array(x):
        from qkern import cudnn

        return cudnn.qconv2d(x, w, bias, act_scale=act_scale, weight_scale=weight_scale,
                             out_scale=out_scale, stride=stride, padding=padding,
                             dilation=dilation, groups=groups, relu=relu, out=out, stream=stream)
    x = _check_int8("x", x, 4)
    w = _check_int8("w", w, 4)
    if stream is not None:
        raise ValueError("stream: only for CUDA input; x is a NumPy array")
    g = geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    ep = epilogue_constants(g.o, bias, act_scale=act_scale, weight_scale=weight_scale,
                            out_scale=out_scale, relu=relu)
    if out is None:
        out = np.empty(g.out_shape, dtype=np.int8)
    else:
        out = _check_out(out, g.out_shape, (("x", x), ("w", w)))
    _conv_cpu.conv2d(x, w, g, ep, out)
    return out
