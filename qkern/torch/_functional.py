"""The functional ops: ``qkern::weight_int8pack_mm`` and ``qkern::qconv2d``.

Each op has a fake (meta) implementation that checks the arguments as the
op does (:mod:`qkern.torch._checks`) and gives the result's shape, dtype,
device and strides, so that it traces under ``torch.compile(fullgraph=True)``
and ``torch.export``. :func:`weight_int8pack_mm` and :func:`qconv2d` are
their documented entry points.
"""

from __future__ import annotations

import numpy as np
import torch

import qkern
from qkern.qconv import as_float
from qkern.torch._checks import check_mm, conv_args, conv_shape, pads, scale_tensor
from qkern.torch._interop import (
    as_numpy,
    define_op,
    host,
    int8_view,
    new_output,
    nhwc,
    run_into,
    unquantize,
)

__all__ = ["qconv2d", "run_conv", "weight_int8pack_mm"]


def _weight_int8pack_mm_eager(x: torch.Tensor, w: torch.Tensor,
                              scales: torch.Tensor) -> torch.Tensor:
    check_mm(x, w, scales)
    w_np, s_np = as_numpy("w", w), as_numpy("scales", scales)
    return run_into(lambda x_np, **kw: qkern.weight_int8pack_mm(x_np, w_np, s_np, **kw),
                    x, w.shape[0])


_weight_int8pack_mm_op, _weight_int8pack_mm_call = define_op("qkern::weight_int8pack_mm",
                                                              _weight_int8pack_mm_eager)


@_weight_int8pack_mm_op.register_fake
def _(x, w, scales):
    check_mm(x, w, scales)
    return x.new_empty(x.shape[:-1] + (w.shape[0],))


def weight_int8pack_mm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``torch._weight_int8pack_mm`` computed by qkern: the custom op ``qkern::weight_int8pack_mm``.

    ``y[..., n] = (sum_k x[..., k] * w[n, k]) * scales[n]``, accumulated in
    fp32 and rounded once to the dtype of ``x`` (see :func:`qkern.weight_int8pack_mm`).
    Works under ``torch.compile(fullgraph=True)`` and ``torch.export``.

    Parameters
    ----------
    x : torch.Tensor
        CPU, shape ``(..., K)`` (PyTorch's op takes 2-D only), dtype float32,
        float16 or bfloat16. Any strides: read in place unless the last
        dimension is not unit-stride, in which case qkern copies it.
    w : torch.Tensor
        CPU, int8, shape ``(N, K)``, contiguous. Packed on every call; use
        :class:`WoqLinear` to pack once.
    scales : torch.Tensor
        CPU, shape ``(N,)``, dtype of ``x``.

    Returns
    -------
    torch.Tensor
        A new contiguous tensor, shape ``(..., N)``, dtype of ``x``, written
        by qkern directly on ``torch.get_num_threads()`` threads.

    Raises
    ------
    TypeError
        An argument is not a tensor or has the wrong dtype.
    ValueError
        An argument is not on the CPU or has the wrong shape, or ``w`` is not
        contiguous.

    Notes
    -----
    Unlike ``torch._weight_int8pack_mm``, any K works and the tensors need
    no particular alignment. There is no autograd formula (nor has PyTorch's
    op one): this is for inference. A plain eager call (CPU tensors, no
    gradient to record, nothing tracing or watching) runs the op's
    implementation without the op, saving the dispatcher's tens of
    microseconds; the result and errors are the same.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> x = torch.tensor([[1.0, 2.0, 3.0]])
    >>> w = torch.tensor([[1, 0, -1], [2, 2, 2]], dtype=torch.int8)
    >>> qkern.torch.weight_int8pack_mm(x, w, torch.tensor([0.5, 1.0]))
    tensor([[-1., 12.]])
    """
    return _weight_int8pack_mm_call(x, w, scales)


# ---- int8 conv2d -------------------------------------------------------------------


def _cuda_views(x: torch.Tensor, out: torch.Tensor) -> tuple:
    """NHWC views of CUDA ``x`` (made channels_last when it is not) and ``out``, and the stream.

    cuDNN reads NHWC memory with unit channel stride: a channels_last tensor.
    """
    x = x.contiguous(memory_format=torch.channels_last)
    return nhwc(x), nhwc(out), torch.cuda.current_stream(x.device)


def _conv_into(out, x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation,
               groups, relu, layer=None) -> None:
    """Write the conv of int8 NCHW-logical ``x`` by OIHW ``w`` into channels_last ``out``.

    CUDA tensors run ``layer`` (a :class:`qkern.cudnn.QConv2d` built from
    these arguments) when given, else a one-call layer.
    """
    if x.device.type == "cuda":
        x_v, out_v, stream = _cuda_views(x, out)
        if layer is not None:
            layer(x_v, out=out_v, stream=stream)
            return
        w_v = nhwc(w).contiguous()              # a dense OHWI weight on the device
    else:
        x_v, w_v, out_v, stream = (as_numpy("x", nhwc(x)), as_numpy("w", nhwc(w)),
                                   as_numpy("out", nhwc(out)), None)
    qkern.qconv2d(x_v, w_v, host(bias), act_scale=act_scale, weight_scale=host(weight_scale),
                  out_scale=out_scale, stride=tuple(stride), padding=pads(padding),
                  dilation=tuple(dilation), groups=groups, relu=relu, out=out_v, stream=stream)


def run_conv(*args, quantized: bool, layer=None) -> torch.Tensor:
    """The op's ``args`` into a new channels_last tensor: int8, or qint8 when ``quantized``.

    A qint8 result has scale ``out_scale`` and zero point 0, and is written
    through an int8 view of its memory.
    """
    x, out_scale = args[0], args[5]
    y = new_output(x, conv_shape(*args), out_scale if quantized else None)
    _conv_into(int8_view(y) if quantized else y, *args, layer=layer)
    return y


@torch.library.custom_op("qkern::qconv2d", mutates_args=())
def _qconv2d_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act_scale: float,
                weight_scale: torch.Tensor, out_scale: float, stride: list[int],
                padding: list[int], dilation: list[int], groups: int,
                relu: bool) -> torch.Tensor:
    return run_conv(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation,
                    groups, relu, quantized=False)


@_qconv2d_op.register_fake
def _(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation, groups, relu):
    return new_output(x, conv_shape(x, w, bias, act_scale, weight_scale, out_scale, stride,
                                    padding, dilation, groups, relu))


def qconv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
            act_scale: float | None = None, weight_scale=None, out_scale: float, stride=1,
            padding=0, dilation=1, groups: int = 1, relu: bool = False) -> torch.Tensor:
    """:func:`qkern.qconv2d` on tensors: int8 conv2d with fused bias, ReLU and requantization.

    Computes what :func:`qkern.qconv2d` computes (docs/qconv2d.rst gives the
    exact arithmetic), on PyTorch's layouts: ``x`` and the result have the
    logical shape NCHW, ``w`` the shape of ``nn.Conv2d.weight``.

    Parameters
    ----------
    x : torch.Tensor
        ``(N, C, H, W)``: int8, or qint8 quantized per tensor with zero point
        0 (its scale is then the activation scale). CPU or CUDA. Any memory
        format; channels_last is what qkern reads without a copy everywhere
        (an NHWC tensor ``t`` is ``t.permute(0, 3, 1, 2)``, channels_last).
    w : torch.Tensor
        ``(O, C/groups, kh, kw)`` on ``x``'s device: int8, or qint8 quantized
        per tensor or per output channel (axis 0), zero points 0.
    bias : torch.Tensor, optional
        float32 ``(O,)``, in real units, on the CPU or ``x``'s device.
    act_scale : float, optional
        Scale of ``x``; required for an int8 ``x``, None for a quantized one.
    weight_scale : float or torch.Tensor, optional
        A float, or a float32 tensor of shape ``()`` or ``(O,)`` (per output
        channel) on the CPU or ``x``'s device; required for an int8 ``w``,
        None for a quantized one.
    out_scale : float
        Scale of the result.
    stride, padding, dilation, groups, relu
        As in :func:`qkern.qconv2d`: ``padding`` may be an int, ``(ph, pw)``
        or ``((top, bottom), (left, right))``.

    Returns
    -------
    torch.Tensor
        ``(N, O, OH, OW)`` in channels_last memory on ``x``'s device: int8,
        or, for a quantized ``x``, qint8 with scale ``out_scale`` and zero
        point 0.

    Raises
    ------
    TypeError
        A tensor of the wrong dtype (``quint8`` included), or a missing scale.
    ValueError
        Wrong shapes or devices, a non-zero zero point, a scale given twice
        (as an argument and by a quantized tensor), or scales that are not
        positive and finite.
    qkern.cudnn.CudnnUnavailableError
        CUDA tensors where qkern's GPU path (``pip install qkern[cuda]``)
        cannot run.

    Notes
    -----
    **Copies.** On the CPU, none: qkern reads ``x`` and ``w`` through NumPy
    views of their memory, whatever their strides, and writes the result
    tensor, allocated by torch, in place; quantized tensors are read and
    written through int8 views of their own memory. On the GPU, an ``x``
    that is not channels_last is copied to channels_last first, ``w`` is
    read as a dense OHWI tensor (a copy unless it is channels_last), ``bias``
    and ``weight_scale`` are read on the host (a device-to-host copy when
    they live on the GPU), and the call runs on
    ``torch.cuda.current_stream()``. Each call builds a one-call
    :class:`qkern.cudnn.QConv2d` (plans are cached process-wide); for repeated
    calls with the same weights, :class:`QConv2d` keeps them on the device.

    **torch.compile.** The work is the custom op ``torch.ops.qkern.qconv2d``,
    with a fake implementation, so int8 calls trace under
    ``torch.compile(fullgraph=True)`` and ``torch.export``. Quantized tensors
    run eagerly only (PyTorch's fake tensors do not support them).

    Examples
    --------
    >>> import torch, qkern.torch
    >>> x = torch.arange(1, 10, dtype=torch.int8).reshape(1, 1, 3, 3)
    >>> w = torch.ones(1, 1, 2, 2, dtype=torch.int8)
    >>> y = qkern.torch.qconv2d(x, w, act_scale=0.5, weight_scale=0.5, out_scale=1.0)
    >>> y
    tensor([[[[3, 4],
              [6, 7]]]], dtype=torch.int8)
    >>> y.is_contiguous(memory_format=torch.channels_last)
    True
    """
    if not isinstance(relu, (bool, np.bool_)):
        raise TypeError(f"relu: expected a bool, got {type(relu).__name__}")
    quantized = isinstance(x, torch.Tensor) and x.is_quantized
    x, act_scale = unquantize("x", x, act_scale, "act_scale", per_channel=False)
    w, weight_scale = unquantize("w", w, weight_scale, "weight_scale", per_channel=True)
    args = (x, w, bias, as_float("act_scale", act_scale), scale_tensor(weight_scale),
            as_float("out_scale", out_scale), *conv_args(stride, padding, dilation), groups,
            bool(relu))
    return run_conv(*args, quantized=True) if quantized else torch.ops.qkern.qconv2d(*args)
