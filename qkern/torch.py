"""PyTorch interop: qkern's int8 WoQ GEMM and int8 conv2d as custom ops and modules.

Imported only by ``import qkern.torch``; ``import qkern`` never imports torch.

Four custom ops, each with a fake (meta) implementation, so that they trace
under ``torch.compile(fullgraph=True)`` and ``torch.export``:

``torch.ops.qkern.weight_int8pack_mm(x, w, scales)``
    What ``torch._weight_int8pack_mm`` computes (the weight is packed on
    every call); :func:`weight_int8pack_mm` is its documented entry point.
``torch.ops.qkern.woq_linear(x, layer)``
    The forward of :class:`WoqLinear`: runs the packed ``qkern.WoqLinear``
    registered under the string ``layer`` in this process.
``torch.ops.qkern.qconv2d(x, w, bias, act_scale, weight_scale, out_scale, ...)``
    :func:`qkern.qconv2d` on int8 CPU or CUDA tensors in PyTorch's layouts
    (NCHW logical shape, channels_last result); :func:`qconv2d` is its
    documented entry point, which also takes quantized tensors.
``torch.ops.qkern.qconv2d_layer(x, layer)``
    The forward of :class:`QConv2d` on a GPU: runs the module registered
    under ``layer``, with its weights and plans kept on the device.

Tensors cross into qkern without a copy: a CPU tensor is viewed as a NumPy
array over the same memory (bfloat16 through its int16 bits, since
``Tensor.numpy()`` has no bfloat16), a CUDA tensor is passed as itself
(DLPack), and the result tensor is allocated by torch and written by qkern
through ``out=``.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

import qkern
from qkern._conv_spec import epilogue_constants, geometry, pair, padding_pairs
from qkern._dtypes import bfloat16

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("qkern.torch needs PyTorch: pip install 'qkern[torch]'") from exc

__all__ = ["QConv2d", "WoqLinear", "qconv2d", "quantize_per_channel", "swap_linears",
           "weight_int8pack_mm"]

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


class _LiveRegistry:
    """What the custom op of a module class needs, by a string key that the
    module's forward passes to the op (a string, so a compiled graph can hold
    it); held weakly, so an entry goes with its module."""

    _keys = itertools.count()  # shared: a key is unique in the process

    def __init__(self, op: str, module: str, prefix: str):
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._op, self._module, self._prefix = op, module, prefix

    def new_key(self) -> str:
        """A key no module of this process has had."""
        return f"{self._prefix}{next(self._keys)}"

    def __setitem__(self, key: str, entry) -> None:
        self._entries[key] = entry

    def __getitem__(self, key: str):
        try:
            return self._entries[key]
        except KeyError:
            raise RuntimeError(f"{self._op}: no live {self._module} with key {key!r} "
                               "in this process") from None


# The packed layers of live WoqLinear modules.
_LAYERS = _LiveRegistry("qkern::woq_linear", "qkern.torch.WoqLinear", "woq")


@torch.library.custom_op("qkern::woq_linear", mutates_args=())
def _woq_linear_op(x: torch.Tensor, layer: str) -> torch.Tensor:
    lin = _LAYERS[layer]
    _check_x(x, lin.shape[1], _TORCH_DTYPES[lin.dtype])
    return _run_into(lin, x, lin.shape[0])


@_woq_linear_op.register_fake
def _(x, layer):
    lin = _LAYERS[layer]
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
        self._key = _LAYERS.new_key()
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


# ---- int8 conv2d -------------------------------------------------------------------
#
# Tensors follow PyTorch's convention: logical shape NCHW (x), OIHW (w), NCHW
# (result), with the memory format free; the result is channels_last. qkern
# works on NHWC / OHWI memory, which is what ``t.permute(0, 2, 3, 1)`` of a
# channels_last tensor is, without a copy.


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """The NHWC (or OHWI) view of a 4-d NCHW-logical (or OIHW) tensor."""
    return t.permute(0, 2, 3, 1)


def _new_output(x: torch.Tensor, shape: tuple, out_scale: float | None = None) -> torch.Tensor:
    """An int8 (or, given ``out_scale``, qint8) channels_last tensor on ``x``'s device."""
    if out_scale is None:
        return torch.empty(shape, dtype=torch.int8, device=x.device,
                           memory_format=torch.channels_last)
    return torch._empty_affine_quantized(shape, scale=out_scale, zero_point=0, dtype=torch.qint8,
                                         device=x.device, memory_format=torch.channels_last)


def _int8_view(q: torch.Tensor) -> torch.Tensor:
    """A plain int8 tensor over the memory of the qint8 tensor ``q`` (``int_repr()`` copies)."""
    return torch.empty(0, dtype=torch.int8, device=q.device).set_(
        q.untyped_storage(), q.storage_offset(), q.shape, q.stride())


def _check_weights(w, bias, weight_scale, device) -> None:
    """Checks of the weight, bias and weight scale of a conv on ``device``.

    ``torch._check_*`` so that they also run, unchanged, on fake tensors.
    """
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


def _pads(padding: list) -> tuple:
    """``[top, bottom, left, right]`` as ``((top, bottom), (left, right))``."""
    top, bottom, left, right = padding
    return (top, bottom), (left, right)


def _conv_shape(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation, groups,
                relu) -> tuple:
    """The checks shared by the eager and the fake ``qkern::qconv2d``; the output shape.

    Takes the op's arguments; the scales and ``relu`` are checked by qkern
    when the op runs (their values are not known at trace time).

    The geometry is validated by qkern's own :func:`qkern._conv_spec.geometry`
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
    _check_weights(w, bias, weight_scale, x.device)
    c, h, wd = (int(n) for n in x.shape[1:])
    o, cg, kh, kw = (int(n) for n in w.shape)
    g = geometry((1, h, wd, c), (o, kh, kw, cg), stride=tuple(stride), padding=_pads(padding),
                 dilation=tuple(dilation), groups=groups)
    return (x.shape[0], g.o, g.oh, g.ow)


def _host(t: torch.Tensor | None):
    """A float32 host array of ``bias`` or per-channel ``weight_scale``; a float for a 0-d scale."""
    if t is None:
        return None
    t = t.detach().cpu()
    return float(t) if t.dim() == 0 else t.numpy()


def _cuda_views(x: torch.Tensor, out: torch.Tensor) -> tuple:
    """NHWC views of CUDA ``x`` (made channels_last when it is not) and ``out``, and the stream.

    cuDNN reads NHWC memory with unit channel stride: a channels_last tensor.
    """
    x = x.contiguous(memory_format=torch.channels_last)
    return _nhwc(x), _nhwc(out), torch.cuda.current_stream(x.device)


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
        w_v = _nhwc(w).contiguous()              # a dense OHWI weight on the device
    else:
        x_v, w_v, out_v, stream = (_as_numpy("x", _nhwc(x)), _as_numpy("w", _nhwc(w)),
                                   _as_numpy("out", _nhwc(out)), None)
    qkern.qconv2d(x_v, w_v, _host(bias), act_scale=act_scale, weight_scale=_host(weight_scale),
                  out_scale=out_scale, stride=tuple(stride), padding=_pads(padding),
                  dilation=tuple(dilation), groups=groups, relu=relu, out=out_v, stream=stream)


def _conv(*args, quantized: bool, layer=None) -> torch.Tensor:
    """The op's ``args`` into a new channels_last tensor: int8, or qint8 when ``quantized``.

    A qint8 result has scale ``out_scale`` and zero point 0, and is written
    through an int8 view of its memory.
    """
    x, out_scale = args[0], args[5]
    y = _new_output(x, _conv_shape(*args), out_scale if quantized else None)
    _conv_into(_int8_view(y) if quantized else y, *args, layer=layer)
    return y


@torch.library.custom_op("qkern::qconv2d", mutates_args=())
def _qconv2d_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act_scale: float,
                weight_scale: torch.Tensor, out_scale: float, stride: list[int],
                padding: list[int], dilation: list[int], groups: int,
                relu: bool) -> torch.Tensor:
    return _conv(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation,
                 groups, relu, quantized=False)


@_qconv2d_op.register_fake
def _(x, w, bias, act_scale, weight_scale, out_scale, stride, padding, dilation, groups, relu):
    return _new_output(x, _conv_shape(x, w, bias, act_scale, weight_scale, out_scale, stride,
                                      padding, dilation, groups, relu))


def _conv_args(stride, padding, dilation) -> tuple:
    """``stride``, ``padding`` and ``dilation`` as the op takes them: lists of 2, 4 and 2 ints."""
    (top, bottom), (left, right) = padding_pairs(padding)
    return ([*pair("stride", stride)], [top, bottom, left, right],
            [*pair("dilation", dilation)])


def _unquantize(name: str, t: torch.Tensor, scale, scale_name: str, per_channel: bool) -> tuple:
    """``(int8 tensor, scale)`` of ``t``: a qint8 tensor's own memory and q-params, or ``t, scale``.

    A quantized ``t`` carries its scale, so ``scale`` must then be None; a
    plain tensor needs it. ``per_channel`` allows per-channel (axis 0) q-params.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_quantized:
        if scale is None:
            raise TypeError(f"{scale_name}: required when {name} is not a quantized tensor")
        return t, scale
    if t.dtype != torch.qint8:
        raise TypeError(f"{name}: expected a qint8 quantized tensor (symmetric int8), got "
                        f"{t.dtype}")
    if scale is not None:
        raise ValueError(f"{scale_name}: must be None when {name} is quantized (its scale is "
                         f"{name}'s own)")
    if per_channel and t.qscheme() == torch.per_channel_affine:
        if t.q_per_channel_axis() != 0:
            raise ValueError(f"{name}: expected per-channel scales along axis 0 (output "
                             f"channels), got axis {t.q_per_channel_axis()}")
        if t.q_per_channel_zero_points().any():
            raise ValueError(f"{name}: expected zero points 0 (qkern's quantization is "
                             "symmetric), got non-zero per-channel zero points")
        scale = t.q_per_channel_scales().to(torch.float32)
    else:
        if t.qscheme() != torch.per_tensor_affine:
            raise ValueError(f"{name}: expected a per-tensor quantized tensor, got {t.qscheme()}")
        if t.q_zero_point() != 0:
            raise ValueError(f"{name}: expected zero_point 0 (qkern's quantization is "
                             f"symmetric), got {t.q_zero_point()}")
        scale = t.q_scale()
    return _int8_view(t), scale


def _float(name: str, v, expected: str = "a float") -> float:
    """A Python float from a real number (the op's schema takes ``float``)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected {expected}, got {type(v).__name__}")
    return float(v)


def _scale_tensor(weight_scale) -> torch.Tensor:
    """``weight_scale`` (a float or a tensor) as the op takes it: a float32 tensor, 0-d or (O,)."""
    if isinstance(weight_scale, torch.Tensor):
        return weight_scale
    return torch.tensor(_float("weight_scale", weight_scale, "a float or a float32 tensor"),
                        dtype=torch.float32)


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
    x, act_scale = _unquantize("x", x, act_scale, "act_scale", per_channel=False)
    w, weight_scale = _unquantize("w", w, weight_scale, "weight_scale", per_channel=True)
    args = (x, w, bias, _float("act_scale", act_scale), _scale_tensor(weight_scale),
            _float("out_scale", out_scale), *_conv_args(stride, padding, dilation), groups,
            bool(relu))
    return _conv(*args, quantized=True) if quantized else torch.ops.qkern.qconv2d(*args)


# The live QConv2d modules.
_CONVS = _LiveRegistry("qkern::qconv2d_layer", "qkern.torch.QConv2d", "qconv")


@torch.library.custom_op("qkern::qconv2d_layer", mutates_args=())
def _qconv2d_layer_op(x: torch.Tensor, layer: str) -> torch.Tensor:
    return _CONVS[layer]._run(x, quantized=False)


@_qconv2d_layer_op.register_fake
def _(x, layer):
    return _new_output(x, _conv_shape(x, *_CONVS[layer]._op_args()))


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
        weight_scale = _scale_tensor(weight_scale)
        _check_weights(weight, bias, weight_scale, weight.device)
        self.stride, self.padding, self.dilation = _conv_args(stride, padding, dilation)
        o, cg, kh, kw = weight.shape
        # Validates the parameters, as qkern.cudnn.QConv2d does, on an input larger than any kernel.
        geometry((1, 1 << 20, 1 << 20, cg * groups), (o, kh, kw, cg), stride=self.stride,
                 padding=_pads(self.padding), dilation=self.dilation, groups=groups)
        self.set_extra_state({"act_scale": act_scale, "out_scale": out_scale})
        epilogue_constants(o, _host(bias), act_scale=self.act_scale,
                           weight_scale=_host(weight_scale), out_scale=self.out_scale, relu=relu)
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
            x, scale = _unquantize("x", x, None, "act_scale", per_channel=False)
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
            _conv_shape(*args)          # the buffers are on x's device before a layer is built
            layer = self._cudnn_layer(x.device)
        return _conv(*args, quantized=quantized, layer=layer)

    def _cudnn_layer(self, device: torch.device):
        """The :class:`qkern.cudnn.QConv2d` of the buffers as they are now, on ``device``."""
        stamp = (device, self.act_scale, self.out_scale,
                 *(None if t is None else (t.data_ptr(), t._version)
                   for t in (self.weight, self.bias, self.weight_scale)))
        if self._cudnn is None or self._cudnn[0] != stamp:
            from qkern import cudnn

            layer = cudnn.QConv2d(_nhwc(self.weight).contiguous(), _host(self.bias),
                                  act_scale=self.act_scale, weight_scale=_host(self.weight_scale),
                                  out_scale=self.out_scale, stride=tuple(self.stride),
                                  padding=_pads(self.padding), dilation=tuple(self.dilation),
                                  groups=self.groups, relu=self.relu, device=device.index)
            self._cudnn = (stamp, layer)
        return self._cudnn[1]

    def get_extra_state(self) -> dict:
        """``{"act_scale": float, "out_scale": float}``, saved in the ``state_dict``."""
        return {"act_scale": self.act_scale, "out_scale": self.out_scale}

    def set_extra_state(self, state: dict) -> None:
        """Set ``act_scale`` and ``out_scale`` from :meth:`get_extra_state`'s dict."""
        self.act_scale = _float("act_scale", state["act_scale"])
        self.out_scale = _float("out_scale", state["out_scale"])

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
