"""The CPU int8 conv2d: exact integer accumulation through BLAS, fp32 epilogue.

The accumulator ``acc = sum x * w`` is computed exactly as a floating-point
GEMM over im2col patches.  Every product of two int8 values is an integer
of magnitude at most ``2**14`` and every partial sum is an integer of
magnitude at most ``K * 2**14`` (``K = kh * kw * C/groups``), so no rounding
occurs in any order of summation while that bound is representable:

- float32 (BLAS ``sgemm``) when ``K * 2**14 <= 2**24``, that is ``K <= 1024``;
- float64 (``dgemm``) otherwise, exact for ``K <= 2**39``.

Patches are built for a block of output pixels at a time, so the scratch
memory stays near :data:`_BLOCK_BYTES` whatever the batch size.
"""

from __future__ import annotations

import numpy as np

from qkern._conv_spec import ConvGeometry, Epilogue

__all__ = ["accumulator_dtype", "conv2d"]

_BLOCK_BYTES = 32 << 20
_F32_EXACT_K = 1 << 10
_LOOP_GROUPS = 32


def accumulator_dtype(k: int) -> np.dtype:
    """The GEMM dtype in which a ``K``-term int8 dot product is exact."""
    return np.dtype(np.float32) if k <= _F32_EXACT_K else np.dtype(np.float64)


def _patches(xp: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """A (N, OH, OW, G, kh, kw, Cg) strided view of the padded input ``xp``."""
    sn, sh, sw, sc = xp.strides
    shape = (g.n, g.oh, g.ow, g.groups, g.kh, g.kw, g.cg)
    strides = (sn, sh * g.stride[0], sw * g.stride[1], sc * g.cg,
               sh * g.dilation[0], sw * g.dilation[1], sc)
    return np.lib.stride_tricks.as_strided(xp, shape, strides, writeable=False)


def _epilogue(acc: np.ndarray, ep: Epilogue) -> np.ndarray:
    """``saturate_int8(rint((f32(acc) + bias') [relu] * multiplier))``, row-major (P, O)."""
    v = acc.astype(np.float32)
    if ep.bias is not None:
        v += ep.bias
    if ep.relu:
        np.maximum(v, np.float32(0), out=v)
    with np.errstate(over="ignore"):
        v *= ep.multiplier
    np.rint(v, out=v)
    np.clip(v, -128, 127, out=v)
    return v.astype(np.int8)


def _blocks(g: ConvGeometry, rows: int):
    """(images, output rows) slices covering the output, about ``rows`` rows each."""
    per_image = rows // g.oh
    if per_image >= 1:
        for n0 in range(0, g.n, per_image):
            yield slice(n0, min(g.n, n0 + per_image)), slice(0, g.oh)
    else:
        for n in range(g.n):
            for h0 in range(0, g.oh, rows):
                yield slice(n, n + 1), slice(h0, min(g.oh, h0 + rows))


def _grouped_matmul(cols: np.ndarray, wg: np.ndarray) -> np.ndarray:
    """``(G, P, K) @ (G, K, Og)`` as a ``(P, G * Og)`` array.

    NumPy's stacked matmul does not reach BLAS's speed; a loop of 2-D
    products does, up to a few dozen groups (depthwise convolutions keep
    the stacked form).
    """
    gcount, p, _ = cols.shape
    if gcount > _LOOP_GROUPS:
        return np.matmul(cols, wg).transpose(1, 0, 2).reshape(p, -1)
    og = wg.shape[2]
    acc = np.empty((p, gcount * og), dtype=cols.dtype)
    for i in range(gcount):
        np.matmul(cols[i], wg[i], out=acc[:, i * og:(i + 1) * og])
    return acc


def conv2d(x: np.ndarray, w: np.ndarray, g: ConvGeometry, ep: Epilogue, out: np.ndarray) -> None:
    """Write the requantized convolution of ``x`` (NHWC) by ``w`` (OHWI) to ``out``.

    Arguments arrive validated (:mod:`qkern.qconv`); ``out`` is an int8
    ``(N, OH, OW, O)`` array of any strides.
    """
    if g.n == 0:
        return
    k = g.kh * g.kw * g.cg
    dt = accumulator_dtype(k)
    view = _patches(np.pad(x, ((0, 0), g.pad_h, g.pad_w, (0, 0))), g)
    # (G, K, Og): one GEMM right-hand side per group, K ordered (kh, kw, Cg) as in w.
    wg = np.ascontiguousarray(w.reshape(g.groups, g.og, k).transpose(0, 2, 1), dtype=dt)
    rows = max(1, _BLOCK_BYTES // (g.ow * k * g.groups * dt.itemsize))
    for ns, hs in _blocks(g, rows):
        block = view[ns, hs]                                   # (nb, hb, OW, G, kh, kw, Cg)
        cols = np.ascontiguousarray(block.transpose(3, 0, 1, 2, 4, 5, 6), dtype=dt)
        acc = _grouped_matmul(cols.reshape(g.groups, -1, k), wg)  # (P, O), exact
        out[ns, hs] = _epilogue(acc, ep).reshape(block.shape[:3] + (g.o,))
