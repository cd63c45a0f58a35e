"""NumPy reference for the int8 conv2d (qkern.qconv2d), independent of qkern.

The accumulator is summed in int64 by a direct loop over kernel taps (no
im2col, no floating point), so it is exact by construction and shares no
code with the CPU path, which sums in float32/float64 through BLAS.  The
epilogue is the specified fp32 sequence (docs/qconv2d.rst), written out
here a second time from the specification:

    s  = f32(act_scale) * f32(weight_scale[o])      fp32, round to nearest even
    b' = f32(bias[o]) / s                           fp32
    m  = s / f32(out_scale)                         fp32
    v  = f32(acc) + b'                              fp32 (f32(acc) rounds to nearest even)
    v  = max(v, 0)                                  when relu
    y  = clip(round_half_even(v * m), -128, 127)    v * m in fp32
"""

from __future__ import annotations

import numpy as np


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_accumulator(x, w, *, stride=1, padding=0, dilation=1, groups=1):
    """Exact int64 accumulator, shape (N, OH, OW, O); padding is int, pair or pair of pairs."""
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    if isinstance(padding, (tuple, list)) and isinstance(padding[0], (tuple, list)):
        (pt, pb), (pl, pr) = padding
    else:
        pt, pl = _pair(padding)
        pb, pr = pt, pl
    n, h, wd, c = x.shape
    o, kh, kw, cg = w.shape
    og = o // groups
    xp = np.zeros((n, h + pt + pb, wd + pl + pr, c), dtype=np.int64)
    xp[:, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    acc = np.zeros((n, oh, ow, o), dtype=np.int64)
    w64 = w.astype(np.int64)
    for gi in range(groups):
        wg = w64[gi * og:(gi + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                           j * dw: j * dw + sw * (ow - 1) + 1: sw, gi * cg:(gi + 1) * cg]
                acc[..., gi * og:(gi + 1) * og] += np.einsum("nhwc,oc->nhwo", patch, wg[:, i, j, :])
    return acc


def requantize(acc, bias, *, act_scale, weight_scale, out_scale, relu):
    """The specified fp32 epilogue applied to an exact accumulator (..., O)."""
    f32 = np.float32
    o = acc.shape[-1]
    ws = np.broadcast_to(np.asarray(weight_scale, dtype=f32), (o,))
    s = np.array([f32(act_scale) * f32(ws[k]) for k in range(o)], dtype=f32)
    m = np.array([s[k] / f32(out_scale) for k in range(o)], dtype=f32)
    v = acc.astype(np.float64).astype(f32)        # exact integer -> one RNE rounding to fp32
    if bias is not None:
        bp = np.array([f32(bias[k]) / s[k] for k in range(o)], dtype=f32)
        v = (v + bp).astype(f32)
    if relu:
        v = np.where(v > 0, v, f32(0)).astype(f32)
    with np.errstate(over="ignore"):
        t = (v * m).astype(f32)
    return np.clip(np.rint(t), -128, 127).astype(np.int8)


def qconv2d_reference(x, w, bias=None, *, act_scale, weight_scale, out_scale, stride=1,
                      padding=0, dilation=1, groups=1, relu=False):
    """int8 (N, OH, OW, O): conv_accumulator followed by requantize."""
    acc = conv_accumulator(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return requantize(acc, bias, act_scale=act_scale, weight_scale=weight_scale,
                      out_scale=out_scale, relu=relu)


def tie_window(x, w, bias, kw, conv_kw, *, slack, absolute=0.0):
    """Where the exact ``t`` lies near a half-integer: where two fp32 epilogues may round apart.

    Near: within ``slack * 2**-24 * (|acc| m + |bias| / out_scale) + absolute``.
    ``kw`` holds act_scale, weight_scale (float or (O,)) and out_scale;
    ``conv_kw`` the geometry arguments of :func:`conv_accumulator`.

    ``t = (acc * act_scale * weight_scale + bias) / out_scale`` in float64 from
    the fp32-rounded scales, ``acc`` exact. A sequence of fp32 operations
    that folds the scales and applies them to ``acc`` and ``bias``, with at
    most four roundings on each term, stays within ``4 * 2**-24 * (|acc| m
    + |bias| / out_scale)`` of it (first order); two such sequences, within
    twice that of each other. ``absolute`` covers a rounding of ``t`` itself
    to a coarser grid.
    """
    f64 = np.float64
    acc = conv_accumulator(x, w, **conv_kw).astype(f64)
    s = f64(np.float32(kw["act_scale"])) * np.asarray(kw["weight_scale"], np.float32).astype(f64)
    out = f64(np.float32(kw["out_scale"]))
    b = np.zeros(w.shape[0]) if bias is None else bias.astype(f64)
    t = (acc * s + b) / out
    dist = np.abs(t - np.floor(t) - 0.5)
    return dist <= slack * 2.0**-24 * (np.abs(acc) * s / out + np.abs(b) / out) + absolute
