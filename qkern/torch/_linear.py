"""``WoqLinear``, an ``nn.Linear`` with int8 weights packed once; its op ``qkern::woq_linear``.

Also :func:`swap_linears`, which puts it (or, for 4 bits, an
:class:`~qkern.torch.Int4Linear`) in place of the ``nn.Linear`` layers of a model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import qkern
from qkern.torch._int4 import Int4Linear
from qkern.torch._interop import TORCH_DTYPES, as_numpy, check_cpu_tensor, from_numpy
from qkern.torch._quantization import quantize_per_channel
from qkern.torch._registry import LiveRegistry, define_linear_op, load_layer_state

__all__ = ["WoqLinear", "swap_linears"]

# The packed layers of live WoqLinear modules, and their op.
_LAYERS = LiveRegistry("qkern::woq_linear", "qkern.torch.WoqLinear", "woq_")
_woq_linear_op = define_linear_op("qkern::woq_linear", _LAYERS)


class WoqLinear(nn.Module):
    """``nn.Linear`` with int8 weights, computed by a packed :class:`qkern.WoqLinear`.

    ``y = x @ (weight * scales[:, None]).T + bias``, weight int8 per output
    channel, accumulated in fp32 and rounded once to the layer's dtype.

    Parameters
    ----------
    weight : torch.Tensor
        int8, shape ``(out_features, in_features)``, CPU.
    scales : torch.Tensor
        Shape ``(out_features,)``; its dtype (float32, float16 or bfloat16)
        is the activation dtype of the layer.
    bias : torch.Tensor, optional
        Shape ``(out_features,)``, dtype of ``scales``.

    Notes
    -----
    **Memory.** The module holds one packed copy of the weight (inside its
    ``qkern.WoqLinear``) and nothing else of size N·K: it has no parameters
    or buffers, and does not keep ``weight``.

    **state_dict.** Holds ``weight`` (int8), ``scales`` and, with a bias,
    ``bias``, the portable unpacked form. ``state_dict()`` unpacks the weight
    on demand (a transient N·K bytes per layer); ``load_state_dict()``
    converts ``scales`` and ``bias`` to the layer's dtype (as
    ``Tensor.copy_`` would) and packs the weight for this machine.

    **dtype and device.** Fixed at construction: ``Module.to()``,
    ``.half()`` and ``.cuda()`` leave the layer as it is (there are no
    tensors to move). Inputs must be CPU tensors of the layer's dtype.

    **torch.compile.** ``forward`` calls the custom op
    ``torch.ops.qkern.woq_linear(x, key)``, with ``key`` naming this
    module's packed layer in a process-wide registry, so a compiled (or
    exported) graph runs in the process that traced it; keys are random
    UUIDs, so in another process the op raises RuntimeError (no live layer
    with that key) rather than finding some other layer. For a graph that
    travels, use :func:`weight_int8pack_mm` with the weights as tensors.
    In plain eager calls (CPU tensors, no gradient to record, no mode or
    transform watching) it runs the op's implementation directly, without
    the dispatcher's 30 or so microseconds.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> linear = torch.nn.Linear(64, 3)
    >>> layer = qkern.torch.WoqLinear.from_linear(linear)
    >>> layer
    WoqLinear(in_features=64, out_features=3, bias=True, dtype=torch.float32)
    >>> layer(torch.randn(5, 64)).shape
    torch.Size([5, 3])
    >>> sorted(layer.state_dict())
    ['bias', 'scales', 'weight']
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self._key = _LAYERS.new_key()
        self._set_layer(weight, scales, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None) -> WoqLinear:
        """Quantize an ``nn.Linear`` with :func:`quantize_per_channel`.

        Parameters
        ----------
        linear : torch.nn.Linear
            On the CPU; its weight is not modified or kept.
        dtype : torch.dtype, optional
            Activation dtype of the new layer (float32, float16 or
            bfloat16); default the dtype of ``linear.weight``.

        Returns
        -------
        WoqLinear
        """
        check_cpu_tensor("weight", linear.weight)
        q, scales = quantize_per_channel(linear.weight, dtype)
        bias = None if linear.bias is None else linear.bias.detach().to(scales.dtype)
        return cls(q, scales, bias)

    def _set_layer(self, weight, scales, bias) -> None:
        """Pack ``weight`` into a new ``qkern.WoqLinear`` and register it under ``self._key``."""
        self._layer = qkern.WoqLinear(np.ascontiguousarray(as_numpy("weight", weight)),
                                      as_numpy("scales", scales),
                                      None if bias is None else as_numpy("bias", bias))
        _LAYERS[self._key] = self._layer

    @property
    def in_features(self) -> int:
        """K, the size of the last dimension of the input."""
        return self._layer.shape[1]

    @property
    def out_features(self) -> int:
        """N, the size of the last dimension of the output."""
        return self._layer.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The activation (and output) dtype."""
        return TORCH_DTYPES[self._layer.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes held by the packed layer (see :attr:`qkern.WoqLinear.nbytes`)."""
        return self._layer.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ (weight * scales[:, None]).T + bias`` for ``x`` of shape ``(..., in_features)``."""
        return _woq_linear_op(x, self._key)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self._layer.bias is not None}, dtype={self.dtype}")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        layer = self._layer
        destination[prefix + "weight"] = torch.from_numpy(layer.weight())
        destination[prefix + "scales"] = from_numpy(layer.scales)
        if layer.bias is not None:
            destination[prefix + "bias"] = from_numpy(layer.bias)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        n, k = self._layer.shape
        expected = {"weight": (n, k), "scales": (n,)}
        if self._layer.bias is not None:
            expected["bias"] = (n,)
        loaded = load_layer_state(self, state_dict, prefix, *args, expected=expected,
                                  weight=("weight", torch.int8))
        if loaded is not None:
            self._set_layer(loaded["weight"], loaded["scales"].to(self.dtype),
                            loaded["bias"].to(self.dtype) if "bias" in loaded else None)

    def __setstate__(self, state):
        # A copy (copy.deepcopy, pickle) has its own packed layer: give it its own key.
        super().__setstate__(state)
        self._key = _LAYERS.new_key()
        _LAYERS[self._key] = self._layer


def swap_linears(model: nn.Module, *, dtype: torch.dtype | None = None, bits: int = 8,
                 group_size: int = 128) -> nn.Module:
    """Replace every ``nn.Linear`` in a module tree by a :class:`WoqLinear`
    (``bits=8``) or an :class:`~qkern.torch.Int4Linear` (``bits=4``).

    Only modules of type exactly ``nn.Linear`` are replaced: subclasses
    (such as the output projection of ``nn.MultiheadAttention``, whose weight
    its parent reads directly) are left alone, and so are ``linear1`` and
    ``linear2`` of an ``nn.TransformerEncoderLayer``, whose fast path (in
    eval, without grad) reads their weights too.

    A linear in several places (twice in one ``nn.Sequential``, or under two
    parents) is quantized once, and the one new layer goes in every place,
    so the model shares it as it shared the linear. Every new layer is
    built before any is put in place: on an error, the model is left as it
    was (meanwhile the float weights and the new layers are held together).

    Parameters
    ----------
    model : torch.nn.Module
        Changed in place, on the CPU.
    dtype : torch.dtype, optional
        Activation dtype of the new layers; default each linear's weight dtype.
    bits : int
        8 (int8 per output channel) or 4 (int4 in groups of ``group_size``
        along ``in_features``, :func:`qkern.quantize_int4`).
    group_size : int
        For ``bits=4``: 32, 64, 128 or 256, dividing every linear's
        ``in_features`` (ValueError naming the first that it does not,
        before any layer is quantized).

    Returns
    -------
    torch.nn.Module
        ``model``, or a new layer when ``model`` itself is an ``nn.Linear``.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    >>> mlp = qkern.torch.swap_linears(mlp, dtype=torch.bfloat16)
    >>> [type(m).__name__ for m in mlp]
    ['WoqLinear', 'ReLU', 'WoqLinear']
    >>> mlp(torch.randn(2, 8, dtype=torch.bfloat16)).dtype
    torch.bfloat16
    """
    if bits not in (4, 8):
        raise ValueError(f"bits: expected 4 or 8, got {bits!r}")
    kept = {id(linear) for module in model.modules()
            if isinstance(module, nn.TransformerEncoderLayer)
            for linear in (module.linear1, module.linear2)}
    # named_modules() lists each module once, under the first of its names.
    linears = [(name or "model", module) for name, module in model.named_modules()
               if type(module) is nn.Linear and id(module) not in kept]
    if bits == 4:
        for name, linear in linears:
            if linear.in_features % group_size:
                raise ValueError(f"{name}: in_features={linear.in_features} is not a multiple "
                                 f"of group_size={group_size}")
    new = {id(linear): _quantized(linear, dtype, bits, group_size) for _, linear in linears}
    if id(model) in new:
        return new[id(model)]
    places = [(name, new[id(module)])
              for name, module in model.named_modules(remove_duplicate=False)
              if id(module) in new]
    for name, layer in places:
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, layer)
    return model


def _quantized(linear: nn.Linear, dtype, bits: int, group_size: int) -> nn.Module:
    """The new layer of ``linear``: :class:`WoqLinear`, or :class:`Int4Linear` for 4 bits."""
    if bits == 4:
        return Int4Linear.from_linear(linear, group_size=group_size, dtype=dtype)
    return WoqLinear.from_linear(linear, dtype=dtype)
