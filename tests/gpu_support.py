"""What the GPU-marked test modules share: why the GPU path cannot run here,
the report they write, and the tie-aware comparison with the exact reference.

Tolerance: the cuDNN graph applies the same fp32 operations to the same fp32
constants as the reference, so results are equal except possibly where
``t = v * m`` lies within fp32 rounding of a half-integer (rounding mode of
the device's float->int8 conversion, and f32(acc) for |acc| > 2**24): there
a difference of 1 is allowed and counted.  Records go to $QKERN_GPU_REPORT
(JSON lines) when it is set; benchmarks/gpu_check.py reads them.
"""

import json
import os

import numpy as np

import qkern
from qconv_reference import conv_accumulator


def report(record: dict) -> None:
    """Append ``record`` to $QKERN_GPU_REPORT, if set."""
    path = os.environ.get("QKERN_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def near_half(x, w, bias, kw):
    """Where v*m (fp32) is within 2 ulp of a half-integer: the only places a difference
    may occur."""
    f32 = np.float32
    acc = conv_accumulator(x, w, stride=kw["stride"], padding=kw["padding"],
                           dilation=kw["dilation"], groups=kw["groups"])
    ep = qkern._conv_spec.epilogue_constants(w.shape[0], bias, act_scale=kw["act_scale"],
                                             weight_scale=kw["weight_scale"],
                                             out_scale=kw["out_scale"], relu=kw["relu"])
    v = acc.astype(np.float64).astype(f32)
    if ep.bias is not None:
        v = v + ep.bias
    if ep.relu:
        v = np.maximum(v, f32(0))
    t = (v * ep.multiplier).astype(f32)
    frac = np.abs(t - np.floor(t) - f32(0.5))
    return frac <= 2 * np.spacing(np.abs(t).astype(f32))


def compare(y, ref, x, w, bias, kw, label):
    """``y`` equals ``ref`` except by 1 where :func:`near_half`; the counts are reported.

    ``kw`` holds every argument of the conv in normalized form (stride,
    padding and dilation as pairs).
    """
    diff = y.astype(np.int16) - ref.astype(np.int16)
    bad = diff != 0
    allowed = near_half(x, w, bias, kw)
    report({"test": label, "elements": int(y.size), "mismatches": int(bad.sum()),
            "ties": int(allowed.sum())})
    assert (np.abs(diff) <= 1).all(), f"{label}: max |diff| {np.abs(diff).max()}"
    assert not (bad & ~allowed).any(), f"{label}: {int((bad & ~allowed).sum())} off-tie mismatches"
