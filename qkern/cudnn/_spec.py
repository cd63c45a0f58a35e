"""What one cuDNN graph computes: :class:`GraphSpec`, also the plan-cache key.

Every field changes the graph or the engines that can run it, so two calls
share a plan exactly when their specs are equal.  Shapes are cuDNN's logical
NCHW order; strides are in elements and describe NHWC memory.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GraphSpec", "UIDS", "nhwc_strides", "round_up"]

# Tensor unique ids by role.  The in-place form gives the conv output, the
# bias-add output and the ReLU output one buffer but keeps their uids apart.
UIDS = {"x": 1, "w": 2, "conv": 3, "bias": 4, "add": 5, "relu": 6, "mult": 7, "y": 8}

FORMS = ("virtual", "inplace")


def round_up(v: int, m: int) -> int:
    """``v`` rounded up to a multiple of ``m``."""
    return -(-v // m) * m


def nhwc_strides(n: int, c: int, h: int, w: int, pixel: int | None = None) -> tuple:
    """Element strides, in NCHW order, of an NHWC tensor whose pixels are ``pixel`` apart."""
    p = c if pixel is None else pixel
    return (h * w * p, 1, w * p, p)


@dataclass(frozen=True)
class GraphSpec:
    """One conv -> add -> ReLU -> mul -> int8 graph.

    Attributes
    ----------
    x_dims, w_dims, y_dims : tuple
        ``(N, C, H, W)``, ``(O, C/groups, kh, kw)``, ``(N, O, OH, OW)`` with C
        and O already padded to cuDNN's multiple.
    x_strides, w_strides, y_strides : tuple
        Element strides in the same order.
    stride, dilation, pre_pad, post_pad : tuple
        ``(vertical, horizontal)``.
    bias, relu, per_channel : bool
        Which pointwise operations the graph holds, and the shape of the
        multiplier (``[1,O,1,1]`` or ``[1,1,1,1]``).
    alignments : tuple
        Byte alignment (<= 16) of the x, w, y, bias and multiplier pointers.
    device : int
        CUDA device ordinal.
    dtypes : tuple
        x, w, intermediates, y; fixed, listed so that the key names them.
    """

    x_dims: tuple
    w_dims: tuple
    y_dims: tuple
    x_strides: tuple
    w_strides: tuple
    y_strides: tuple
    stride: tuple
    dilation: tuple
    pre_pad: tuple
    post_pad: tuple
    bias: bool
    relu: bool
    per_channel: bool
    alignments: tuple = (16, 16, 16, 16, 16)
    device: int = 0
    dtypes: tuple = ("int8", "int8", "float32", "int8")

    def describe(self) -> str:
        """A one-line summary for error messages."""
        return (f"x{list(self.x_dims)} w{list(self.w_dims)} -> y{list(self.y_dims)} (NCHW dims, "
                f"NHWC memory) stride={self.stride} dilation={self.dilation} "
                f"pad={self.pre_pad}/{self.post_pad} bias={self.bias} relu={self.relu} "
                f"per_channel={self.per_channel} align={self.alignments}")
