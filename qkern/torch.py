"""PyTorch interop: qkern's int8 WoQ GEMM as ``torch.library`` custom ops and an ``nn.Module``.

Imported only by ``import qkern.torch``; ``import qkern`` never imports torch.

Two custom ops, each with a fake (meta) implementation, so that they trace
under ``torch.compile(fullgraph=True)`` and ``torch.export``:

``torch.ops.qkern.weight_int8pack_mm(x, w, scales)``
    What ``torch._weight_int8pack_mm`` computes (the weight is packed on
    every call); :func:`weight_int8pack_mm` is its documented entry point.
``torch.ops.qkern.woq_linear(x, layer)``
    The forward of :class:`WoqLinear`: runs the packed ``qkern.WoqLinear``
    registered under the string ``layer`` in this process.

Tensors cross into qkern without a copy: a contiguous CPU tensor is viewed as
a NumPy array over the same memory (bfloat16 through its int16 bits, since
``Tensor.numpy()`` has no bfloat16), and the result tensor is allocated by
torch and written by qkern through ``out=``.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

import qkern
from qkern._dtypes import bfloat16

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("qkern.torch needs PyTorch: pip install 'qkern[torch]'") from exc

__all__ = ["WoqLinear", "quantize_per_channel", "swap_linears", "weight_int8pack_mm"]

# Activation dtypes, torch -> NumPy.
_DTYPES = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
           torch.bfloat16: bfloat16}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def _as_numpy(name: str, t) -> np.ndarray:
    """A NumPy array over the memory of the CPU tensor ``t`` (no copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got device {t.device}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16)
    return t.numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """A torch tensor holding a copy of ``a`` (bfloat16 through its bits)."""
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _check_x(x, k, dtype) -> None:
    """Check the activation tensor against a weight of K columns and ``dtype`` scales.

    ``torch._check_*`` so that symbolic shapes under ``torch.compile`` are
    checked without specializing.
    """
    torch._check_value(x.device.type == "cpu",
                       lambda: f"x: expected a CPU tensor, got device {x.device}")
    torch._check_type(x.dtype in _DTYPES,
                      lambda: f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    torch._check_type(x.dtype == dtype,
                      lambda: f"x: expected dtype {dtype} (the dtype of the scales), got {x.dtype}")
    torch._check_value(x.dim() >= 1, lambda: "x: expected shape (..., K), got a 0-d tensor")
    torch._check_value(x.shape[-1] == k,
                       lambda: f"x: expected last dimension K={k} (from w), got shape "
                               f"{tuple(x.shape)}")


def _check_mm(x, w, scales) -> None:
    """The argument checks shared by the eager and the fake ``weight_int8pack_mm``."""
    for name, t in (("w", w), ("scales", scales)):
        torch._check_value(t.device.type == "cpu",
                           lambda: f"{name}: expected a CPU tensor, got device {t.device}")
    torch._check_type(w.dtype == torch.int8, lambda: f"w: expected dtype int8, got {w.dtype}")
    torch._check_value(w.dim() == 2, lambda: f"w: expected shape (N, K), got {tuple(w.shape)}")
    torch._check_value(w.is_contiguous(), lambda: "w: expected a contiguous (N, K) tensor")
    torch._check_type(scales.dtype == x.dtype,
                      lambda: f"scales: expected dtype {x.dtype} (the dtype of x), "
                              f"got {scales.dtype}")
    torch._check_value(scales.dim() == 1 and scales.shape[0] == w.shape[0],
                       lambda: f"scales: expected shape ({w.shape[0]},) to match w's N, got "
                               f"{tuple(scales.shape)}")
    _check_x(x, w.shape[1], scales.dtype)


def _run_into(fn, x: torch.Tensor, n: int) -> torch.Tensor:
    """``fn(x, out=y, num_threads=...)`` over NumPy views; returns the new tensor ``y``.

    ``y`` is a fresh contiguous tensor of shape ``(..., n)``; qkern writes it
    in place, on ``torch.get_num_threads()`` threads.
    """
    y = x.new_empty(x.shape[:-1] + (n,))
    fn(_as_numpy("x", x), out=_as_numpy("out", y), num_threads=torch.get_num_threads())
    return y


@torch.library.custom_op("qkern::weight_int8pack_mm", mutates_args=())
def _weight_int8pack_mm_op(x: torch.Tensor, w: torch.Tensor,
                           scales: torch.Tensor) -> torch.Tensor:
    _check_mm(x, w, scales)
    w_np, s_np = _as_numpy("w", w), _as_numpy("scales", scales)
    return _run_into(lambda x_np, **kw: qkern.weight_int8pack_mm(x_np, w_np, s_np, **kw),
                     x, w.shape[0])


@_weight_int8pack_mm_op.register_fake
def _(x, w, scales):
    _check_mm(x, w, scales)
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
    op one): this is for inference.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> x = torch.tensor([[1.0, 2.0, 3.0]])
    >>> w = torch.tensor([[1, 0, -1], [2, 2, 2]], dtype=torch.int8)
    >>> qkern.torch.weight_int8pack_mm(x, w, torch.tensor([0.5, 1.0]))
    tensor([[-1., 12.]])
    """
    return torch.ops.qkern.weight_int8pack_mm(x, w, scales)


def quantize_per_channel(weight: torch.Tensor, dtype: torch.dtype | None = None) -> tuple:
    """Symmetric int8 quantization with one scale per output channel (row).

    ``scales[n]`` is ``max_k |weight[n, k]| / 127`` rounded *up* to ``dtype``,
    and ``q[n, k] = round(weight[n, k] / scales[n])`` (ties to even), so
    ``|weight - q * scales| <= scales / 2`` elementwise with ``|q| <= 127``.
    All-zero rows get scale 0 and zero weights.

    Parameters
    ----------
    weight : torch.Tensor
        Floating point, shape ``(N, K)``, finite.
    dtype : torch.dtype, optional
        dtype of the scales (float32, float16 or bfloat16); default the dtype
        of ``weight``.

    Returns
    -------
    q : torch.Tensor
        int8, shape ``(N, K)``, contiguous.
    scales : torch.Tensor
        Shape ``(N,)``, ``dtype``.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> q, s = qkern.torch.quantize_per_channel(torch.tensor([[0.5, -1.27], [0.0, 0.0]]))
    >>> q
    tensor([[  50, -127],
            [   0,    0]], dtype=torch.int8)
    >>> s
    tensor([0.0100, 0.0000])
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight: expected a floating (N, K) tensor, got {weight.dtype} "
                         f"of shape {tuple(weight.shape)}")
    dtype = weight.dtype if dtype is None else dtype
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected torch.float32, float16 or bfloat16, got {dtype}")
    w64 = weight.detach().to(torch.float64)
    if not torch.isfinite(w64).all():
        raise ValueError("weight: has inf or NaN entries")
    exact = w64.abs().amax(dim=1) / 127 if w64.shape[1] else w64.new_zeros(w64.shape[0])
    scales = exact.to(dtype)
    scales = torch.where(scales.to(torch.float64) < exact,
                         torch.nextafter(scales, torch.full_like(scales, float("inf"))), scales)
    if not torch.isfinite(scales).all():
        raise ValueError(f"weight: max |weight| / 127 overflows {dtype}")
    s64 = scales.to(torch.float64)[:, None]
    q = torch.where(s64 > 0, torch.round(w64 / torch.where(s64 > 0, s64, 1.0)), 0.0)
    return q.to(torch.int8), scales


# The packed layers of live WoqLinear modules, by the key their forward passes to
# torch.ops.qkern.woq_linear (a string, so a compiled graph can hold it).
_LAYERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def _layer(key: str) -> qkern.WoqLinear:
    try:
        return _LAYERS[key]
    except KeyError:
        raise RuntimeError(f"qkern::woq_linear: no live qkern.torch.WoqLinear with key {key!r} "
                           "in this process") from None


@torch.library.custom_op("qkern::woq_linear", mutates_args=())
def _woq_linear_op(x: torch.Tensor, layer: str) -> torch.Tensor:
    lin = _layer(layer)
    _check_x(x, lin.shape[1], _TORCH_DTYPES[lin.dtype])
    return _run_into(lin, x, lin.shape[0])


@_woq_linear_op.register_fake
def _(x, layer):
    lin = _layer(layer)
    _check_x(x, lin.shape[1], _TORCH_DTYPES[lin.dtype])
    return x.new_empty(x.shape[:-1] + (lin.shape[0],))


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
    exported) graph runs in the process that traced it. For a graph that
    travels, use :func:`weight_int8pack_mm` with the weights as tensors.

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
        self._key = f"woq{next(_KEYS)}"
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
        q, scales = quantize_per_channel(linear.weight, dtype)
        bias = None if linear.bias is None else linear.bias.detach().to(scales.dtype)
        return cls(q, scales, bias)

    def _set_layer(self, weight, scales, bias) -> None:
        """Pack ``weight`` into a new ``qkern.WoqLinear`` and register it under ``self._key``."""
        self._layer = qkern.WoqLinear(np.ascontiguousarray(_as_numpy("weight", weight)),
                                      _as_numpy("scales", scales),
                                      None if bias is None else _as_numpy("bias", bias))
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
        return _TORCH_DTYPES[self._layer.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes held by the packed layer (see :attr:`qkern.WoqLinear.nbytes`)."""
        return self._layer.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ (weight * scales[:, None]).T + bias`` for ``x`` of shape ``(..., in_features)``."""
        return torch.ops.qkern.woq_linear(x, self._key)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self._layer.bias is not None}, dtype={self.dtype}")

    def _state_names(self) -> tuple:
        return ("weight", "scales") + (("bias",) if self._layer.bias is not None else ())

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        layer = self._layer
        destination[prefix + "weight"] = torch.from_numpy(layer.weight())
        destination[prefix + "scales"] = _from_numpy(layer.scales)
        if layer.bias is not None:
            destination[prefix + "bias"] = _from_numpy(layer.bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # As nn.Module's own implementation does, which this one replaces.
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)
        names = self._state_names()
        if strict:
            unexpected_keys.extend(key for key in state_dict if key.startswith(prefix)
                                   and key[len(prefix):] not in names)
        missing = [prefix + name for name in names if prefix + name not in state_dict]
        missing_keys.extend(missing)
        if missing:
            return
        n, k = self._layer.shape
        expected = {"weight": (n, k), "scales": (n,), "bias": (n,)}
        loaded = {name: state_dict[prefix + name] for name in names}
        bad = [f"size mismatch for {prefix}{name}: copying a param with shape "
               f"{tuple(t.shape)} from checkpoint, the shape in current model is "
               f"{expected[name]}." for name, t in loaded.items()
               if tuple(t.shape) != expected[name]]
        if loaded["weight"].dtype != torch.int8:
            bad.append(f"dtype mismatch for {prefix}weight: expected torch.int8, got "
                       f"{loaded['weight'].dtype}.")
        if bad:
            error_msgs.extend(bad)
            return
        self._set_layer(loaded["weight"], loaded["scales"].to(self.dtype),
                        loaded["bias"].to(self.dtype) if "bias" in loaded else None)

    def __setstate__(self, state):
        # A copy (copy.deepcopy, pickle) has its own packed layer: give it its own key.
        super().__setstate__(state)
        self._key = f"woq{next(_KEYS)}"
        _LAYERS[self._key] = self._layer


def swap_linears(model: nn.Module, *, dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` in a module tree by a :class:`WoqLinear`.

    Only modules of type exactly ``nn.Linear`` are replaced: subclasses
    (such as the output projection of ``nn.MultiheadAttention``, whose weight
    its parent reads directly) are left alone.

    Parameters
    ----------
    model : torch.nn.Module
        Changed in place, on the CPU.
    dtype : torch.dtype, optional
        Activation dtype of the new layers; default each linear's weight dtype.

    Returns
    -------
    torch.nn.Module
        ``model``, or a new :class:`WoqLinear` when ``model`` itself is an
        ``nn.Linear``.

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
    if type(model) is nn.Linear:
        return WoqLinear.from_linear(model, dtype=dtype)
    for name, child in model.named_children():
        setattr(model, name, swap_linears(child, dtype=dtype))
    return model
