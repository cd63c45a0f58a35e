"""int4 groupwise WoQ for PyTorch: the op ``qkern::weight_int4pack_mm``,
:class:`Int4Linear` and its op ``qkern::int4_linear``, and conversion from
PyTorch's own packed int4 weights.

PyTorch's ``torch._convert_weight_to_int4pack_for_cpu`` packs in a layout
that depends on the ISA of the machine that packed (and its PyTorch
version). :func:`int4_from_torch_packed` reads such a tensor without
assuming a layout: it learns where PyTorch, on this machine, puts each
value of an ``(N, K)`` weight by packing probes whose values number the
positions (and refuses a packing that is not a reordering of the values).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import qkern
from qkern.torch._checks import check_type, check_value, check_x_dtype, check_x_shape
from qkern.torch._interop import DTYPES, TORCH_DTYPES, as_numpy, define_op, from_numpy, run_into
from qkern.torch._registry import LiveRegistry, define_linear_op, load_layer_state

__all__ = ["Int4Linear", "int4_from_torch_packed", "weight_int4pack_mm"]


def _check_int4_mm(x, w_packed, group_size, scales_and_zeros) -> None:
    check_x_dtype(x)
    for name, t in (("w_packed", w_packed), ("scales_and_zeros", scales_and_zeros)):
        check_value(t.device.type == "cpu", lambda name=name, t=t:
                    f"{name}: expected a CPU tensor, got device {t.device}")
    check_type(w_packed.dtype == torch.uint8,
               lambda: f"w_packed: expected dtype uint8 (from qkern.pack_int4), "
                       f"got {w_packed.dtype}")
    check_value(w_packed.dim() == 3 and w_packed.shape[2] == 16,
                lambda: f"w_packed: expected shape (ceil(N / 32), K, 16) from "
                        f"qkern.pack_int4, got {tuple(w_packed.shape)}")
    check_value(w_packed.is_contiguous(), lambda: "w_packed: expected a contiguous tensor")
    check_type(scales_and_zeros.dtype == x.dtype,
               lambda: f"scales_and_zeros: expected dtype {x.dtype} (the dtype of x), "
                       f"got {scales_and_zeros.dtype}")
    check_value(group_size in qkern.woq_int4.GROUP_SIZES,
                lambda: f"group_size: expected one of {qkern.woq_int4.GROUP_SIZES}, "
                        f"got {group_size}")
    k = w_packed.shape[1]
    check_value(k % group_size == 0,
                lambda: f"K={k} is not a multiple of group_size={group_size}")
    check_value(
        scales_and_zeros.dim() == 3 and scales_and_zeros.shape[0] == k // group_size
        and scales_and_zeros.shape[2] == 2
        and (scales_and_zeros.shape[1] + 31) // 32 == w_packed.shape[0],
        lambda: f"scales_and_zeros: expected shape ({k // group_size}, N, 2) with N in the "
                f"{w_packed.shape[0]} panels of w_packed, got {tuple(scales_and_zeros.shape)}")
    check_x_shape(x, k)


def _weight_int4pack_mm_eager(x: torch.Tensor, w_packed: torch.Tensor, group_size: int,
                              scales_and_zeros: torch.Tensor) -> torch.Tensor:
    _check_int4_mm(x, w_packed, group_size, scales_and_zeros)
    w_np, sz_np = as_numpy("w_packed", w_packed), as_numpy("scales_and_zeros", scales_and_zeros)
    return run_into(lambda x_np, **kw: qkern.weight_int4pack_mm(x_np, w_np, group_size, sz_np,
                                                                **kw),
                    x, scales_and_zeros.shape[1])


_weight_int4pack_mm_op, _weight_int4pack_mm_call = define_op("qkern::weight_int4pack_mm",
                                                              _weight_int4pack_mm_eager)


@_weight_int4pack_mm_op.register_fake
def _(x, w_packed, group_size, scales_and_zeros):
    _check_int4_mm(x, w_packed, group_size, scales_and_zeros)
    return x.new_empty(x.shape[:-1] + (scales_and_zeros.shape[1],))


def weight_int4pack_mm(x: torch.Tensor, w_packed: torch.Tensor, group_size: int,
                       scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """``torch._weight_int4pack_mm_for_cpu`` computed by qkern, on qkern's packed
    layout: the custom op ``qkern::weight_int4pack_mm``.

    ``y[..., n] = sum_k x[..., k] * ((q[n, k] - 8) * s[g, n] + z[g, n])``
    (see :func:`qkern.weight_int4pack_mm`). Works under
    ``torch.compile(fullgraph=True)`` and ``torch.export``.

    Parameters
    ----------
    x : torch.Tensor
        CPU, shape ``(..., K)``, dtype float32, float16 or bfloat16.
    w_packed : torch.Tensor
        CPU, uint8, shape ``(ceil(N / 32), K, 16)``, contiguous: the packed
        int4 layout of :func:`qkern.pack_int4` (the same on every machine;
        :func:`int4_from_torch_packed` converts PyTorch's).
    group_size : int
        32, 64, 128 or 256.
    scales_and_zeros : torch.Tensor
        CPU, shape ``(K // group_size, N, 2)``, dtype of ``x``.

    Returns
    -------
    torch.Tensor
        A new contiguous tensor, shape ``(..., N)``, dtype of ``x``.

    Examples
    --------
    >>> import torch, qkern, qkern.torch
    >>> q, sz = qkern.quantize_int4(torch.randn(8, 64).numpy(), 32)
    >>> w = torch.from_numpy(qkern.pack_int4(q))
    >>> qkern.torch.weight_int4pack_mm(torch.randn(2, 64), w, 32, torch.from_numpy(sz)).shape
    torch.Size([2, 8])
    """
    return _weight_int4pack_mm_call(x, w_packed, group_size, scales_and_zeros)


# ---- PyTorch's packed int4 --------------------------------------------------------


def _nibbles(packed: torch.Tensor) -> np.ndarray:
    """The 4-bit values of a packed uint8 tensor, low nibble of each byte first."""
    b = packed.contiguous().numpy().reshape(-1)
    return np.stack([b & 15, b >> 4], axis=-1).reshape(-1)


def _is_permutation(positions: np.ndarray) -> bool:
    """Whether the int32 ``positions`` hold each of ``0 .. positions.size - 1`` once."""
    size = positions.size
    if size and positions.view(np.uint32).max() >= size:  # a negative one is >= 2**31 too
        return False
    seen = np.zeros(size, bool)
    seen[positions] = True
    return bool(seen.all())


def _torch_int4_positions(n: int, k: int) -> np.ndarray:
    """Where ``torch._convert_weight_to_int4pack_for_cpu`` on this machine puts
    each value of an ``(n, k)`` weight: entry j is the flat index ``n * K + k``
    of the value held by nibble j of the packed bytes.

    Learned from one probe per hexadecimal digit of the flat indices (each
    value set to that digit of its own index). The int32 buffers, 4 bytes a
    weight each, go when the conversion returns: nothing is kept.
    """
    size = n * k
    if size >= 2**31:
        raise ValueError(f"an ({n}, {k}) weight is too large to convert")
    index = np.arange(size, dtype=np.int32)
    probe = np.empty_like(index)
    positions = np.zeros_like(index)
    for digit in range(max(1, -(-(size - 1).bit_length() // 4))):
        np.right_shift(index, 4 * digit, out=probe)
        probe &= 15
        nib = _nibbles(torch._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(probe).view(n, k), 1))
        if nib.size != size:
            raise ValueError(f"PyTorch packed an ({n}, {k}) weight into {nib.size} values")
        positions |= nib.astype(np.int32) << (4 * digit)
    if not _is_permutation(positions):
        raise ValueError("PyTorch's int4 packing here is not a reordering of the values")
    return positions


def int4_from_torch_packed(packed: torch.Tensor, n: int, k: int) -> np.ndarray:
    """The ``(N, K)`` values 0..15 of a weight packed by
    ``torch._convert_weight_to_int4pack_for_cpu`` on this machine.

    Parameters
    ----------
    packed : torch.Tensor
        uint8, shape ``(N, K / 2)``, from
        ``torch._convert_weight_to_int4pack_for_cpu(q, ...)``.
    n, k : int
        The shape of ``q``.

    Returns
    -------
    numpy.ndarray
        uint8 ``(N, K)``, ready for :func:`qkern.pack_int4`.

    Raises
    ------
    ValueError
        If ``packed`` has not the shape ``(n, k / 2)`` (so ``n`` and ``k``
        swapped are refused), or PyTorch's packing here is not a reordering
        of the values.

    Notes
    -----
    The bytes themselves cannot tell which layout packed them: a tensor
    packed on another machine (another ISA or PyTorch version) may be laid
    out otherwise and would be read wrongly. Convert where it was packed,
    and keep :func:`qkern.pack_int4`'s layout, the same everywhere.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> q = torch.randint(0, 16, (32, 64), dtype=torch.int32)
    >>> packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    >>> bool((qkern.torch.int4_from_torch_packed(packed, 32, 64) == q.numpy()).all())
    True
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed: expected a uint8 torch.Tensor, got {packed!r:.80}")
    if tuple(packed.shape) != (n, k / 2):  # never equal for an odd k: PyTorch refuses one
        raise ValueError(f"packed: shape {tuple(packed.shape)} is not ({n}, {k / 2:g}), the "
                         f"shape of an ({n}, {k}) int4 weight packed by PyTorch")
    q = np.empty(n * k, np.uint8)
    q[_torch_int4_positions(n, k)] = _nibbles(packed.cpu())
    return q.reshape(n, k)


# ---- the module -------------------------------------------------------------------

# The qkern.Int4Linear layers of live Int4Linear modules, and their op.
_LAYERS = LiveRegistry("qkern::int4_linear", "qkern.torch.Int4Linear", "int4_")
_int4_linear_op = define_linear_op("qkern::int4_linear", _LAYERS)


class Int4Linear(nn.Module):
    """``nn.Linear`` with 4-bit groupwise weights, computed by a :class:`qkern.Int4Linear`.

    ``y = x @ W.T + bias``, ``W[n, k] = (q[n, k] - 8) * s[g, n] + z[g, n]``.

    Parameters
    ----------
    w_packed : torch.Tensor
        uint8, shape ``(ceil(out_features / 32), in_features, 16)``: the
        packed int4 layout of :func:`qkern.pack_int4`.
    group_size : int
        32, 64, 128 or 256.
    scales_and_zeros : torch.Tensor
        Shape ``(in_features // group_size, out_features, 2)``; its dtype is
        the activation dtype of the layer.
    bias : torch.Tensor, optional
        Shape ``(out_features,)``, dtype of ``scales_and_zeros``.

    Notes
    -----
    **state_dict.** ``w_packed`` (qkern's packed layout, the same on every
    machine, so a checkpoint travels), ``scales_and_zeros`` and, with a bias,
    ``bias``. The module has no parameters or buffers: the layer holds the
    one packed copy. ``torch.compile`` and dtype/device rules are those of
    :class:`qkern.torch.WoqLinear`.

    Examples
    --------
    >>> import torch, qkern.torch
    >>> layer = qkern.torch.Int4Linear.from_linear(torch.nn.Linear(64, 3), group_size=32)
    >>> layer
    Int4Linear(in_features=64, out_features=3, group_size=32, bias=True, dtype=torch.float32)
    >>> layer(torch.randn(5, 64)).shape
    torch.Size([5, 3])
    >>> sorted(layer.state_dict())
    ['bias', 'scales_and_zeros', 'w_packed']
    """

    def __init__(self, w_packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self._key = _LAYERS.new_key()
        self._set_layer(w_packed, group_size, scales_and_zeros, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group_size: int = 128,
                    dtype: torch.dtype | None = None) -> Int4Linear:
        """Quantize an ``nn.Linear`` with :func:`qkern.quantize_int4`.

        Parameters
        ----------
        linear : torch.nn.Linear
            On the CPU; ``in_features`` a multiple of ``group_size``; its
            weight is not modified or kept.
        group_size : int
            32, 64, 128 or 256.
        dtype : torch.dtype, optional
            Activation dtype of the new layer; default the dtype of
            ``linear.weight``.
        """
        dtype = linear.weight.dtype if dtype is None else dtype
        if dtype not in DTYPES:
            raise TypeError(f"dtype: expected torch.float32, float16 or bfloat16, got {dtype}")
        q, sz = qkern.quantize_int4(as_numpy("weight", linear.weight.detach().to(dtype)),
                                    group_size)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(torch.from_numpy(qkern.pack_int4(q)), group_size, from_numpy(sz), bias)

    @classmethod
    def from_torch_int4pack(cls, packed: torch.Tensor, group_size: int,
                            scales_and_zeros: torch.Tensor, bias: torch.Tensor | None = None, *,
                            in_features: int) -> Int4Linear:
        """The layer of a weight packed by PyTorch
        (``torch._convert_weight_to_int4pack_for_cpu``, on this machine), for
        the ``scales_and_zeros`` that ``torch._weight_int4pack_mm_for_cpu``
        takes with it; see :func:`int4_from_torch_packed`."""
        q = int4_from_torch_packed(packed, scales_and_zeros.shape[1], in_features)
        return cls(torch.from_numpy(qkern.pack_int4(q)), group_size, scales_and_zeros, bias)

    def _set_layer(self, w_packed, group_size, scales_and_zeros, bias) -> None:
        """Build the ``qkern.Int4Linear`` (it copies) and register it under ``self._key``."""
        self._layer = qkern.Int4Linear(as_numpy("w_packed", w_packed), group_size,
                                       as_numpy("scales_and_zeros", scales_and_zeros),
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
    def group_size(self) -> int:
        """k values per scale and zero."""
        return self._layer.group_size

    @property
    def dtype(self) -> torch.dtype:
        """The activation (and output) dtype."""
        return TORCH_DTYPES[self._layer.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes held by the layer (see :attr:`qkern.Int4Linear.nbytes`)."""
        return self._layer.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` of shape ``(..., in_features)``."""
        return _int4_linear_op(x, self._key)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self._layer.bias is not None}, "
                f"dtype={self.dtype}")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        layer = self._layer
        destination[prefix + "w_packed"] = torch.from_numpy(layer.packed_weight.copy())
        destination[prefix + "scales_and_zeros"] = from_numpy(layer.scales_and_zeros)
        if layer.bias is not None:
            destination[prefix + "bias"] = from_numpy(layer.bias)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        layer = self._layer
        expected = {"w_packed": layer.packed_weight.shape,
                    "scales_and_zeros": layer.scales_and_zeros.shape}
        if layer.bias is not None:
            expected["bias"] = (self.out_features,)
        loaded = load_layer_state(self, state_dict, prefix, *args, expected=expected,
                                  weight=("w_packed", torch.uint8))
        if loaded is not None:
            self._set_layer(loaded["w_packed"].contiguous(), self.group_size,
                            loaded["scales_and_zeros"].to(self.dtype).contiguous(),
                            loaded["bias"].to(self.dtype) if "bias" in loaded else None)

    def __setstate__(self, state):
        # A copy (copy.deepcopy, pickle) has its own layer: give it its own key.
        super().__setstate__(state)
        self._key = _LAYERS.new_key()
        _LAYERS[self._key] = self._layer
