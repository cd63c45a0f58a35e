"""``QConv2d``, a quantized ``nn.Conv2d`` that holds its weights.

Its forward runs the op ``qkern::qconv2d`` on the CPU, and on a GPU the op
defined here, ``qkern::qconv2d_layer``, which runs the module's own
:class:`qkern.cudnn.QConv2d`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from qkern.qconv import as_float, epilogue_constants, geometry
from qkern.torch._checks import check_weights, conv_args, conv_shape, pads, scale_tensor
from qkern.torch._functional import run_conv
from qkern.torch._interop import host, new_output, nhwc, unquantize
from qkern.torch._quantization import quantize_per_channel
from qkern.torch._registry import LiveRegistry

__all__ = ["QConv2d"]

# The live QConv2d modules.
_CONVS = LiveRegistry("qkern::qconv2d_layer", "qkern.torch.QConv2d", "qconv_")


@torch.library.custom_op("qkern::qconv2d_layer", mutates_args=())
def _qconv2d_layer_op(x: torch.Tensor, layer: str) -> torch.Tensor:
    return _CONVS[layer]._run(x, quantized=False)


@_qconv2d_layer_op.register_fake
def _(x, layer):
    return new_output(x, conv_shape(x, *_CONVS[layer]._op_args()))


class QConv2d(nn.Module):
    """A quantized ``nn.Conv2d``: int8 weights, fused bias, ReLU and requantization.

    The forward of :func:`qconv2d` with the weights held by the module:
    ``x`` int8 (or qint8) ``(N, C, H, W)`` with scale ``act_scale``, result
    int8 (or qint8) ``(N, O, OH, OW)``, channels_last, with scale ``out_scale``.

    Parameters
    ----------
    weight : torch.Tensor
        int8 ``(O, C/groups, kh, kw)``; stored channels_last (copied when it
        is not), on its device.
    bias : torch.Tensor, optional
        float32 ``(O,)``, real units.
    act_scale, out_scale : float
        Scales of the input and of the result.
    weight_scale : float or torch.Tensor
        A float, or a float32 tensor ``(O,)`` (per output channel).
    stride, padding, dilation, groups, relu
        As in :func:`qconv2d`.

    Notes
    -----
    **state_dict.** Buffers ``weight`` (int8), ``weight_scale`` (float32,
    shape ``()`` or ``(O,)``) and, with a bias, ``bias``; ``act_scale`` and
    ``out_scale`` are the module's extra state. ``load_state_dict`` copies
    into the buffers (a weight that is not int8 is an error, not a
    conversion).

    **Devices.** ``Module.to()`` moves the buffers, as for any module.
    On the CPU, ``forward`` runs the custom op ``torch.ops.qkern.qconv2d``
    with the buffers as arguments (a graph that holds it travels, with the
    buffers). On a GPU, it runs ``torch.ops.qkern.qconv2d_layer(x, key)``:
    the module keeps a :class:`qkern.cudnn.QConv2d` (weights on the device,
    bias and multipliers folded, plans cached), built at the first call and
    rebuilt when a buffer is replaced or changed in place (its version
    counter moves) or the scales change. That layer reads the weight buffer
    in place when ``C/groups`` and ``O/groups`` are multiples of 4, and
    holds a padded copy otherwise. ``key`` names the module in a registry
    of this process, so such a graph runs only where it was traced.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    >>> layer = qkern.torch.QConv2d.from_float(conv, act_scale=0.02, out_scale=0.05)
    >>> layer
    QConv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), \
groups=1, bias=True, relu=False, act_scale=0.02, out_scale=0.05, per_channel=True)
    >>> x = torch.randint(-128, 128, (2, 3, 16, 16), dtype=torch.int8)
    >>> layer(x).shape
    torch.Size([2, 8, 16, 16])
    >>> sorted(layer.state_dict())
    ['_extra_state', 'bias', 'weight', 'weight_scale']
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 act_scale: float, weight_scale, out_scale: float, stride=1, padding=0,
                 dilation=1, groups: int = 1, relu: bool = False):
        super().__init__()
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
        weight_scale = scale_tensor(weight_scale)
        check_weights(weight, bias, weight_scale, weight.device)
        self.stride, self.padding, self.dilation = conv_args(stride, padding, dilation)
        o, cg, kh, kw = weight.shape
        # Validates the parameters, as qkern.cudnn.QConv2d does, on an input larger than any kernel.
        geometry((1, 1 << 20, 1 << 20, cg * groups), (o, kh, kw, cg), stride=self.stride,
                 padding=pads(self.padding), dilation=self.dilation, groups=groups)
        self.set_extra_state({"act_scale": act_scale, "out_scale": out_scale})
        epilogue_constants(o, host(bias), act_scale=self.act_scale,
                           weight_scale=host(weight_scale), out_scale=self.out_scale, relu=relu)
        self.groups, self.relu = int(groups), bool(relu)
        self.register_buffer("weight",
                             weight.detach().contiguous(memory_format=torch.channels_last))
        self.register_buffer("bias", None if bias is None else bias.detach().to(weight.device))
        self.register_buffer("weight_scale", weight_scale.detach().to(weight.device))
        self._register()

    def _register(self) -> None:
        self._key = _CONVS.new_key()
        self._cudnn = None              # (stamp, qkern.cudnn.QConv2d), built by the first CUDA call
        _CONVS[self._key] = self

    @classmethod
    def from_float(cls, conv: nn.Conv2d, act_scale: float, out_scale: float, *,
                   relu: bool = False) -> QConv2d:
        """Quantize an ``nn.Conv2d``: int8 weights with a scale per output channel.

        The weight of each output channel is quantized by
        :func:`quantize_per_channel` (symmetric, ``|q| <= 127``, error at most
        half a scale); a channel of zeros gets scale 1 (its weights stay 0,
        and qkern needs positive scales). The bias is kept in float32.

        Parameters
        ----------
        conv : torch.nn.Conv2d
            ``padding_mode="zeros"``; ``padding`` may be ``"same"`` or
            ``"valid"``. Not modified or kept.
        act_scale, out_scale : float
            Scales of the layer's input and result.
        relu : bool
            Fuse a ReLU.

        Returns
        -------
        QConv2d
            On ``conv``'s device.
        """
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv: expected a torch.nn.Conv2d, got {type(conv).__name__}")
        if conv.padding_mode != "zeros":
            raise ValueError(f"conv: expected padding_mode 'zeros', got {conv.padding_mode!r}")
        padding = conv.padding
        if padding == "valid":
            padding = 0
        elif padding == "same":           # as PyTorch pads: the odd element after
            total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
            padding = tuple((t // 2, t - t // 2) for t in total)
        weight = conv.weight.detach()
        q, scales = quantize_per_channel(weight.reshape(weight.shape[0], -1), torch.float32)
        bias = None if conv.bias is None else conv.bias.detach().to(torch.float32)
        return cls(q.reshape(weight.shape), bias, act_scale=act_scale,
                   weight_scale=torch.where(scales > 0, scales, 1.0), out_scale=out_scale,
                   stride=conv.stride, padding=padding, dilation=conv.dilation,
                   groups=conv.groups, relu=relu)

    @property
    def in_channels(self) -> int:
        """C, the channels of the input."""
        return self.weight.shape[1] * self.groups

    @property
    def out_channels(self) -> int:
        """O, the channels of the result."""
        return self.weight.shape[0]

    @property
    def kernel_size(self) -> tuple:
        """``(kh, kw)``."""
        return tuple(self.weight.shape[2:])

    def _op_args(self) -> tuple:
        """The arguments of ``torch.ops.qkern.qconv2d`` after ``x``."""
        return (self.weight, self.bias, self.act_scale, self.weight_scale, self.out_scale,
                self.stride, self.padding, self.dilation, self.groups, self.relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The conv of ``x`` (int8, or qint8 with scale ``act_scale``), as :func:`qconv2d`."""
        if isinstance(x, torch.Tensor) and x.is_quantized:
            x, scale = unquantize("x", x, None, "act_scale", per_channel=False)
            if np.float32(scale) != np.float32(self.act_scale):
                raise ValueError(f"x: quantized with scale {scale}, but the layer's act_scale "
                                 f"is {self.act_scale}")
            return self._run(x, quantized=True)
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return torch.ops.qkern.qconv2d_layer(x, self._key)
        return torch.ops.qkern.qconv2d(x, *self._op_args())

    def _run(self, x: torch.Tensor, *, quantized: bool) -> torch.Tensor:
        """The conv of int8 ``x``; on a GPU through this module's :class:`qkern.cudnn.QConv2d`."""
        args = (x, *self._op_args())
        layer = None
        if x.device.type == "cuda":
            conv_shape(*args)          # the buffers are on x's device before a layer is built
            layer = self._cudnn_layer(x.device)
        return run_conv(*args, quantized=quantized, layer=layer)

    def _cudnn_layer(self, device: torch.device):
        """The :class:`qkern.cudnn.QConv2d` of the buffers as they are now, on ``device``."""
        stamp = (device, self.act_scale, self.out_scale,
                 *(None if t is None else (t.data_ptr(), t._version)
                   for t in (self.weight, self.bias, self.weight_scale)))
        if self._cudnn is None or self._cudnn[0] != stamp:
            from qkern import cudnn

            layer = cudnn.QConv2d(nhwc(self.weight).contiguous(), host(self.bias),
                                  act_scale=self.act_scale, weight_scale=host(self.weight_scale),
                                  out_scale=self.out_scale, stride=tuple(self.stride),
                                  padding=pads(self.padding), dilation=tuple(self.dilation),
                                  groups=self.groups, relu=self.relu, device=device.index)
            self._cudnn = (stamp, layer)
        return self._cudnn[1]

    def get_extra_state(self) -> dict:
        """``{"act_scale": float, "out_scale": float}``, saved in the ``state_dict``."""
        return {"act_scale": self.act_scale, "out_scale": self.out_scale}

    def set_extra_state(self, state: dict) -> None:
        """Set ``act_scale`` and ``out_scale`` from :meth:`get_extra_state`'s dict."""
        self.act_scale = as_float("act_scale", state["act_scale"])
        self.out_scale = as_float("out_scale", state["out_scale"])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None and weight.dtype != torch.int8:
            error_msgs.append(f"dtype mismatch for {prefix}weight: expected torch.int8, got "
                              f"{weight.dtype}.")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={tuple(self.stride)}, padding={tuple(self.padding)}, "
                f"dilation={tuple(self.dilation)}, groups={self.groups}, "
                f"bias={self.bias is not None}, relu={self.relu}, act_scale={self.act_scale}, "
                f"out_scale={self.out_scale}, per_channel={self.weight_scale.dim() == 1}")

    def __getstate__(self):
        # The device layer is not picklable; a copy builds its own at its first CUDA call.
        return {**self.__dict__, "_cudnn": None}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._register()
