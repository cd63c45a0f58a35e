"""Symmetric int8 quantization of float weights, one scale per output channel."""

from __future__ import annotations

import torch

from qkern.torch._interop import DTYPES

__all__ = ["quantize_per_channel"]


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
    if dtype not in DTYPES:
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
