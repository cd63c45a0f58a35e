"""The int8 conv2d problem, shared by the CPU path and the cuDNN path.

Both paths start here: the convolution geometry normalised from the user's
arguments (:class:`ConvGeometry`), and the fp32 epilogue constants folded on
the host (:func:`epilogue_constants`).  Computing the constants once, in one
place, is what makes the two paths agree bit for bit wherever the device
applies the same fp32 operations (docs/qconv2d.rst, "Semantics").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ConvGeometry", "Epilogue", "as_float", "epilogue_constants", "geometry", "pair",
           "padding_pairs"]


def as_float(name: str, v, expected: str = "a float") -> float:
    """A real number (not a bool) as a Python float: the type check of a scale argument.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    v : int, float, numpy.integer or numpy.floating
        The value.
    expected : str
        What the message says was expected.

    Returns
    -------
    float
        ``float(v)``.

    Raises
    ------
    TypeError
        ``v`` is a bool or not a real number.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected {expected}, got {type(v).__name__}")
    return float(v)


def pair(name: str, v) -> tuple[int, int]:
    """``v``, an int or a pair of ints, as a pair of Python ints.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    v : int or (int, int)
        Not a bool.

    Returns
    -------
    (int, int)

    Raises
    ------
    TypeError
        ``v`` is not an int or a pair of ints.
    """
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an int or a pair of ints, got {v!r}")
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    try:
        a, b = v
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected an int or a pair of ints, got {v!r}") from None
    if any(isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer)) for e in (a, b)):
        raise TypeError(f"{name}: expected an int or a pair of ints, got {v!r}")
    return int(a), int(b)


def padding_pairs(v) -> tuple[tuple[int, int], tuple[int, int]]:
    """Padding given as ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``, in the last form.

    Parameters
    ----------
    v : int, (int, int) or ((int, int), (int, int))
        The same on every side, ``(ph, pw)`` on both sides of each axis, or
        each side.

    Returns
    -------
    ((int, int), (int, int))
        ``((top, bottom), (left, right))``.

    Raises
    ------
    TypeError
        ``v`` has none of these forms.
    ValueError
        A negative value.
    """
    sequence = (tuple, list)
    if isinstance(v, sequence) and len(v) == 2 and all(isinstance(e, sequence) for e in v):
        (top, bottom), (left, right) = pair("padding", v[0]), pair("padding", v[1])
    else:
        top, left = pair("padding", v)
        bottom, right = top, left
    if min(top, bottom, left, right) < 0:
        raise ValueError(f"padding: expected values >= 0, got {v!r}")
    return (top, bottom), (left, right)


@dataclass(frozen=True)
class ConvGeometry:
    """Shapes and parameters of one grouped 2-D convolution, NHWC / OHWI.

    Attributes
    ----------
    n, h, w, c : int
        Input batch, height, width and channels.
    o, kh, kw : int
        Output channels and kernel height and width.
    groups : int
        ``c`` and ``o`` are split into this many groups.
    stride, dilation : tuple of int
        ``(vertical, horizontal)``.
    pad_h, pad_w : tuple of int
        ``(before, after)`` zero padding of each spatial axis.
    oh, ow : int
        Output height and width.
    """

    n: int
    h: int
    w: int
    c: int
    o: int
    kh: int
    kw: int
    groups: int
    stride: tuple
    dilation: tuple
    pad_h: tuple
    pad_w: tuple
    oh: int
    ow: int

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def og(self) -> int:
        """Output channels per group."""
        return self.o // self.groups

    @property
    def out_shape(self) -> tuple:
        """``(n, oh, ow, o)``."""
        return (self.n, self.oh, self.ow, self.o)

    def describe(self) -> str:
        """A one-line summary for error messages."""
        return (f"x=({self.n},{self.h},{self.w},{self.c}) "
                f"w=({self.o},{self.kh},{self.kw},{self.cg}) "
                f"stride={self.stride} padding=({self.pad_h},{self.pad_w}) "
                f"dilation={self.dilation} groups={self.groups}")


def geometry(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1) -> ConvGeometry:
    """Validate and normalise the geometry of ``x`` (NHWC) and ``w`` (OHWI).

    Parameters
    ----------
    x_shape : tuple of int
        ``(N, H, W, C)``.
    w_shape : tuple of int
        ``(O, kh, kw, C/groups)``.
    stride, padding, dilation, groups
        As in :func:`qkern.qconv2d`.

    Returns
    -------
    ConvGeometry

    Raises
    ------
    TypeError
        A parameter of the wrong type.
    ValueError
        Inconsistent shapes, or an empty output.
    """
    if len(x_shape) != 4:
        raise ValueError(f"x: expected shape (N, H, W, C), got {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"w: expected shape (O, kh, kw, C/groups), got {tuple(w_shape)}")
    n, h, w, c = map(int, x_shape)
    o, kh, kw, cg = map(int, w_shape)
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, (int, np.integer)):
        raise TypeError(f"groups: expected an int, got {groups!r}")
    groups = int(groups)
    stride, dilation = pair("stride", stride), pair("dilation", dilation)
    pad_h, pad_w = padding_pairs(padding)
    if min(stride) < 1:
        raise ValueError(f"stride: expected values >= 1, got {stride}")
    if min(dilation) < 1:
        raise ValueError(f"dilation: expected values >= 1, got {dilation}")
    if groups < 1:
        raise ValueError(f"groups: expected >= 1, got {groups}")
    if min(o, kh, kw, cg) < 1:
        raise ValueError("w: expected a non-empty (O, kh, kw, C/groups) weight, got "
                         f"{tuple(w_shape)}")
    if c % groups or o % groups:
        raise ValueError(f"groups={groups} must divide C={c} and O={o}")
    if cg * groups != c:
        raise ValueError(f"w: expected last dimension C/groups={c // groups} "
                         f"(C={c}, groups={groups}), got shape {tuple(w_shape)}")
    if min(h, w) < 1:
        raise ValueError(f"x: expected H, W >= 1, got shape {tuple(x_shape)}")
    oh = (h + sum(pad_h) - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + sum(pad_w) - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"the dilated kernel ({dilation[0] * (kh - 1) + 1}, "
                         f"{dilation[1] * (kw - 1) + 1}) "
                         f"is larger than the padded input ({h + sum(pad_h)}, {w + sum(pad_w)})")
    return ConvGeometry(n, h, w, c, o, kh, kw, groups, stride, dilation, pad_h, pad_w, oh, ow)


@dataclass(frozen=True)
class Epilogue:
    """The fp32 constants of the requantizing epilogue.

    Attributes
    ----------
    bias : numpy.ndarray or None
        float32 ``(O,)``: ``bias[o] / (act_scale * weight_scale[o])``.
    multiplier : numpy.ndarray
        float32, shape ``(1,)`` (per-tensor weight scale) or ``(O,)``
        (per-channel): ``act_scale * weight_scale[o] / out_scale``.
    relu : bool
        Whether ``max(v, 0)`` is applied before the multiplier.
    """

    bias: np.ndarray | None
    multiplier: np.ndarray
    relu: bool

    @property
    def per_channel(self) -> bool:
        """Whether the multiplier varies with the output channel."""
        return self.multiplier.shape[0] != 1


def _positive_scale(name: str, v) -> np.float32:
    as_float(name, v)
    f = np.float32(v)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"{name}: expected a finite float > 0 (as float32), got {v!r}")
    return f


def epilogue_constants(o: int, bias, *, act_scale, weight_scale, out_scale,
                       relu: bool) -> Epilogue:
    """Fold the scales and the bias into the epilogue's fp32 constants.

    With every value first rounded to float32, and each operation below one
    IEEE fp32 operation rounded to nearest even:

    - ``s[o] = act_scale * weight_scale[o]``
    - ``bias'[o] = bias[o] / s[o]``
    - ``multiplier[o] = s[o] / out_scale``

    Parameters
    ----------
    o : int
        Output channels.
    bias : array_like or None
        float32 ``(O,)``.
    act_scale, out_scale : float
        Positive, finite as float32.
    weight_scale : float or array_like
        A float (per-tensor) or a float32 ``(O,)`` array (per-channel).
    relu : bool
        Apply ``max(v, 0)``.

    Returns
    -------
    Epilogue

    Raises
    ------
    TypeError, ValueError
        A scale that is not a positive finite float32, a per-channel scale or
        bias of the wrong dtype or shape, or constants that overflow fp32.
    """
    if not isinstance(relu, (bool, np.bool_)):
        raise TypeError(f"relu: expected a bool, got {type(relu).__name__}")
    a = _positive_scale("act_scale", act_scale)
    out = _positive_scale("out_scale", out_scale)
    if isinstance(weight_scale, np.ndarray):
        if weight_scale.dtype != np.float32:
            raise TypeError("weight_scale: expected a float or a float32 array, got dtype "
                            f"{weight_scale.dtype}")
        if weight_scale.shape != (o,):
            raise ValueError(f"weight_scale: expected shape ({o},) (one per output channel), "
                             f"got {weight_scale.shape}")
        ws = weight_scale
        if not (np.isfinite(ws).all() and (ws > 0).all()):
            raise ValueError("weight_scale: expected finite values > 0")
    else:
        ws = np.array([_positive_scale("weight_scale", weight_scale)], dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        s = (a * ws).astype(np.float32)
        multiplier = (s / out).astype(np.float32)
        b = None
        if bias is not None:
            if not isinstance(bias, np.ndarray) or bias.dtype != np.float32:
                raise TypeError("bias: expected a float32 numpy.ndarray of shape (O,), got "
                                + (f"dtype {bias.dtype}" if isinstance(bias, np.ndarray)
                                   else type(bias).__name__))
            if bias.shape != (o,):
                raise ValueError(f"bias: expected shape ({o},), got {bias.shape}")
            if not np.isfinite(bias).all():
                raise ValueError("bias: expected finite values")
            b = (bias / (s if s.shape[0] == o else s[0])).astype(np.float32)
    if not ((s > 0).all() and np.isfinite(s).all()):
        raise ValueError("act_scale * weight_scale underflows or overflows float32")
    if not (np.isfinite(multiplier).all() and (multiplier > 0).all()):
        raise ValueError("act_scale * weight_scale / out_scale underflows or overflows float32")
    if b is not None and not np.isfinite(b).all():
        raise ValueError("bias / (act_scale * weight_scale) overflows float32")
    return Epilogue(b, multiplier, bool(relu))
