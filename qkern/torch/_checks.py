"""The ops' argument checks, and their arguments in the form the ops' schemas take.

The checks are shared by the eager and the fake implementation of each op,
so that errors come at trace time too. They use ``torch._check_*``, so that
they run, unchanged, on fake tensors, and check symbolic shapes under
``torch.compile`` without specializing them; the GEMM ops' checks go
through :func:`check_value` and :func:`check_type`, which skip torch's
call for a concrete check that passed. The conv geometry and the
types of scalars are checked by qkern's own helpers (:mod:`qkern.qconv`).
"""

from __future__ import annotations

import torch

from qkern.qconv import as_float, geometry, padding_pairs, pair
from qkern.torch._interop import DTYPES

__all__ = ["check_mm", "check_type", "check_value", "check_weights", "check_x", "check_x_dtype",
           "check_x_shape", "conv_args", "conv_shape", "pads", "scale_tensor"]


def check_value(cond, message) -> None:
    """``torch._check_value(cond, message)``, skipped where ``cond`` is the
    bool True: a concrete check that passed, which torch's call takes a
    microsecond or two to confirm (a GEMM op checks a dozen things per
    call). A symbolic ``cond`` goes to torch."""
    if cond is not True:
        torch._check_value(cond, message)


def check_type(cond, message) -> None:
    """``torch._check_type(cond, message)``, as :func:`check_value`."""
    if cond is not True:
        torch._check_type(cond, message)


def check_x_dtype(x) -> None:
    """Check that the activation tensor is on the CPU, in an activation dtype.

    The GEMM ops check this first, as the dtype of their scales is checked
    against ``x``'s.
    """
    check_value(x.device.type == "cpu",
                lambda: f"x: expected a CPU tensor, got device {x.device}")
    check_type(x.dtype in DTYPES,
               lambda: f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")


def check_x_shape(x, k) -> None:
    """Check the activation tensor's shape against a weight of K columns."""
    check_value(x.dim() >= 1, lambda: "x: expected shape (..., K), got a 0-d tensor")
    check_value(x.shape[-1] == k,
                lambda: f"x: expected last dimension K={k} (from w), got shape "
                        f"{tuple(x.shape)}")


def check_x(x, k, dtype) -> None:
    """Check the activation tensor against a weight of K columns and ``dtype`` scales."""
    check_x_dtype(x)
    check_type(x.dtype == dtype,
               lambda: f"x: expected dtype {dtype} (the dtype of the scales), got {x.dtype}")
    check_x_shape(x, k)


def check_mm(x, w, scales) -> None:
    """The argument checks of ``qkern::weight_int8pack_mm``."""
    check_x_dtype(x)
    for name, t in (("w", w), ("scales", scales)):
        check_value(t.device.type == "cpu",
                    lambda: f"{name}: expected a CPU tensor, got device {t.device}")
    check_type(w.dtype == torch.int8, lambda: f"w: expected dtype int8, got {w.dtype}")
    check_value(w.dim() == 2, lambda: f"w: expected shape (N, K), got {tuple(w.shape)}")
    check_value(w.is_contiguous(), lambda: "w: expected a contiguous (N, K) tensor")
    check_type(scales.dtype == x.dtype,
               lambda: f"scales: expected dtype {x.dtype} (the dtype of x), "
                       f"got {scales.dtype}")
    check_value(scales.dim() == 1 and scales.shape[0] == w.shape[0],
                lambda: f"scales: expected shape ({w.shape[0]},) to match w's N, got "
                        f"{tuple(scales.shape)}")
    check_x_shape(x, w.shape[1])


def check_weights(w, bias, weight_scale, device) -> None:
    """Checks of the weight, bias and weight scale of a conv on ``device``."""
    torch._check_type(w.dtype == torch.int8, lambda: f"w: expected dtype int8, got {w.dtype}")
    torch._check_value(w.dim() == 4, lambda: f"w: expected shape (O, C/groups, kh, kw), got "
                                             f"{tuple(w.shape)}")
    torch._check_value(w.device == device,
                       lambda: f"w: on {w.device}, but x is on {device} (move the layer or "
                               "weights to x's device)")
    o = w.shape[0]
    for name, t, shapes in (("bias", bias, ((o,),)), ("weight_scale", weight_scale, ((), (o,)))):
        if t is None:
            continue
        torch._check_type(t.dtype == torch.float32,
                          lambda: f"{name}: expected dtype float32, got {t.dtype}")
        torch._check_value(tuple(t.shape) in shapes,
                           lambda: f"{name}: expected shape {' or '.join(map(str, shapes))} "
                                   f"(O={o}), got {tuple(t.shape)}")
        torch._check_value(t.device.type == "cpu" or t.device == device,
                           lambda: f"{name}: on {t.device}, expected the CPU or {device}")


def pads(padding: list) -> tuple:
    """``[top, bottom, left, right]`` as ``((top, bottom), (left, right))``."""
    top, bottom, left, right = padding
    return (top, bottom), (left, right)


def conv_shape(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation, groups,
               relu) -> tuple:
    """The argument checks of ``qkern::qconv2d``; the output shape.

    Takes the op's arguments; the scales and ``relu`` are checked by qkern
    when the op runs (their values are not known at trace time).

    The geometry is validated by qkern's own :func:`qkern.qconv.geometry`
    on concrete sizes: under dynamic shapes the batch stays symbolic, while
    C, H and W specialize.
    """
    torch._check_type(x.dtype == torch.int8,
                      lambda: f"x: expected dtype int8 (or a qint8 quantized tensor), got "
                              f"{x.dtype}")
    torch._check_value(x.dim() == 4, lambda: f"x: expected shape (N, C, H, W), got "
                                             f"{tuple(x.shape)}")
    torch._check_value(x.device.type in ("cpu", "cuda"),
                       lambda: f"x: expected a CPU or CUDA tensor, got device {x.device}")
    check_weights(w, bias, weight_scale, x.device)
    c, h, wd = (int(n) for n in x.shape[1:])
    o, cg, kh, kw = (int(n) for n in w.shape)
    g = geometry((1, h, wd, c), (o, kh, kw, cg), stride=tuple(stride), padding=pads(padding),
                 dilation=tuple(dilation), groups=groups)
    return (x.shape[0], g.o, g.oh, g.ow)


def conv_args(stride, padding, dilation) -> tuple:
    """``stride``, ``padding`` and ``dilation`` as the op takes them: lists of 2, 4 and 2 ints."""
    (top, bottom), (left, right) = padding_pairs(padding)
    return ([*pair("stride", stride)], [top, bottom, left, right],
            [*pair("dilation", dilation)])


def scale_tensor(weight_scale) -> torch.Tensor:
    """``weight_scale`` (a float or a tensor) as the op takes it: a float32 tensor, 0-d or (O,)."""
    if isinstance(weight_scale, torch.Tensor):
        return weight_scale
    return torch.tensor(as_float("weight_scale", weight_scale, "a float or a float32 tensor"),
                        dtype=torch.float32)
