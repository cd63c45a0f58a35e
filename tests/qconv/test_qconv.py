"""qkern.qconv2d on NumPy input (the CPU path) against the independent
int64 reference in qconv_reference.py: exact equality, over a hypothesis
sweep of shapes and parameters, pinned edge cases, and the error paths."""

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

import qkern
from qconv_reference import conv_accumulator, qconv2d_reference, requantize
from qkern import _conv_cpu

I8 = np.int8


def _problem(seed, n, h, w, cg, og, groups, kh, kw, per_channel, with_bias, value_kind):
    rng = np.random.default_rng(seed)
    c, o = cg * groups, og * groups
    if value_kind == "extremes":
        x = rng.choice(np.array([-128, 127, -1, 0, 1], dtype=I8), size=(n, h, w, c))
        wt = rng.choice(np.array([-128, 127, -127], dtype=I8), size=(o, kh, kw, cg))
    else:
        x = rng.integers(-128, 128, (n, h, w, c), dtype=I8)
        wt = rng.integers(-128, 128, (o, kh, kw, cg), dtype=I8)
    ws = (rng.uniform(2e-4, 2e-2, o).astype(np.float32) if per_channel
          else float(rng.uniform(2e-4, 2e-2)))
    bias = (rng.standard_normal(o) * 4).astype(np.float32) if with_bias else None
    return x, wt, ws, bias, rng


@given(
    n=st.integers(0, 3), h=st.integers(1, 12), w=st.integers(1, 12),
    cg=st.integers(1, 9), og=st.integers(1, 9), groups=st.sampled_from([1, 1, 2, 3]),
    kh=st.integers(1, 7), kw=st.integers(1, 7),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dilation=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pad=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    per_channel=st.booleans(), with_bias=st.booleans(), relu=st.booleans(),
    out_scale=st.floats(1e-3, 50.0), value_kind=st.sampled_from(["uniform", "extremes"]),
    seed=st.integers(0, 2**32 - 1),
)
@example(n=1, h=1, w=1, cg=3, og=5, groups=1, kh=1, kw=1, stride=(1, 1), dilation=(1, 1),
         pad=(0, 0, 0, 0), per_channel=True, with_bias=True, relu=True, out_scale=0.1,
         value_kind="uniform", seed=0)                                      # 1x1, output 1x1
@example(n=2, h=7, w=7, cg=3, og=6, groups=1, kh=7, kw=7, stride=(2, 2), dilation=(1, 1),
         pad=(3, 3, 3, 3), per_channel=False, with_bias=True, relu=False, out_scale=0.5,
         value_kind="extremes", seed=1)                                     # 7x7 stem
@example(n=1, h=7, w=7, cg=5, og=7, groups=1, kh=7, kw=7, stride=(1, 1), dilation=(1, 1),
         pad=(0, 0, 0, 0), per_channel=True, with_bias=False, relu=False, out_scale=1.0,
         value_kind="uniform", seed=2)                                      # output 1x1
@example(n=1, h=9, w=5, cg=1, og=1, groups=3, kh=3, kw=3, stride=(1, 2), dilation=(2, 1),
         pad=(2, 2, 1, 0), per_channel=True, with_bias=True, relu=True, out_scale=0.02,
         value_kind="uniform", seed=3)                                      # depthwise-like
def test_matches_reference(n, h, w, cg, og, groups, kh, kw, stride, dilation, pad, per_channel,
                           with_bias, relu, out_scale, value_kind, seed):
    padding = ((pad[0], pad[1]), (pad[2], pad[3]))
    assume(h + pad[0] + pad[1] >= dilation[0] * (kh - 1) + 1)
    assume(w + pad[2] + pad[3] >= dilation[1] * (kw - 1) + 1)
    x, wt, ws, bias, _ = _problem(seed, n, h, w, cg, og, groups, kh, kw, per_channel, with_bias,
                                  value_kind)
    kwargs = dict(act_scale=0.05, weight_scale=ws, out_scale=out_scale, stride=stride,
                  padding=padding, dilation=dilation, groups=groups, relu=relu)
    y = qkern.qconv2d(x, wt, bias, **kwargs)
    ref = qconv2d_reference(x, wt, bias, **kwargs)
    assert y.dtype == np.int8 and y.shape == ref.shape
    np.testing.assert_array_equal(y, ref)


def test_saturates_and_rounds_half_to_even():
    # 1x1 conv of one channel with w = 1: acc = x; m = 0.5 puts every odd x on a .5 boundary.
    x = np.arange(-128, 128, dtype=I8).reshape(1, 1, 256, 1)
    w = np.ones((1, 1, 1, 1), dtype=I8)
    y = qkern.qconv2d(x, w, act_scale=1.0, weight_scale=1.0, out_scale=2.0)
    np.testing.assert_array_equal(y.ravel(), np.rint(np.arange(-128, 128) / 2).astype(I8))
    assert y.ravel()[128 + 1] == 0 and y.ravel()[128 + 3] == 2 and y.ravel()[128 - 1] == 0
    big = qkern.qconv2d(x, w, act_scale=1.0, weight_scale=1.0, out_scale=0.01)
    assert big.min() == -128 and big.max() == 127
    relu = qkern.qconv2d(x, w, act_scale=1.0, weight_scale=1.0, out_scale=0.01, relu=True)
    assert relu.min() == 0 and relu.max() == 127


def test_large_k_uses_float64_and_stays_exact():
    # K = 3*3*128 = 1152 > 1024: the float32 GEMM could round; float64 must be used.
    assert _conv_cpu.accumulator_dtype(1024) == np.float32
    assert _conv_cpu.accumulator_dtype(1025) == np.float64
    x = np.full((1, 3, 3, 128), -128, dtype=I8)
    w = np.full((2, 3, 3, 128), -128, dtype=I8)
    w[1] = 127
    acc = conv_accumulator(x, w)
    assert acc[0, 0, 0, 0] == 1152 * 16384 and acc[0, 0, 0, 0] > 2**24
    y = qkern.qconv2d(x, w, act_scale=2.0**-10, weight_scale=2.0**-10, out_scale=1.0)
    np.testing.assert_array_equal(y, requantize(acc, None, act_scale=2.0**-10,
                                                weight_scale=2.0**-10, out_scale=1.0, relu=False))
    assert y[0, 0, 0, 0] == 18 and y[0, 0, 0, 1] == -18


def test_accumulator_rounding_to_fp32_is_round_half_even():
    # acc = 2**24 + 1 is not a float32; f32(acc) rounds to 2**24 (even), so y = 2**24 * m exactly.
    x = np.ones((1, 1, 1, 1025), dtype=I8)
    x[..., :1024] = 127
    x[..., 1024] = 0
    w = np.full((1, 1, 1, 1025), 127, dtype=I8)
    acc = conv_accumulator(x, w)
    assert acc.item() == 1024 * 127 * 127
    y = qkern.qconv2d(x, w, act_scale=1.0, weight_scale=1.0, out_scale=2.0**18)
    assert y.item() == requantize(acc, None, act_scale=1.0, weight_scale=1.0, out_scale=2.0**18,
                                  relu=False).item() == 63


def test_blocks_cover_large_batches(monkeypatch):
    # Force tiny blocks so the (image, row) tiling is exercised on a small problem.
    monkeypatch.setattr(_conv_cpu, "_BLOCK_BYTES", 1)
    x, wt, ws, bias, _ = _problem(4, 3, 5, 6, 4, 5, 1, 3, 3, True, True, "uniform")
    kwargs = dict(act_scale=0.1, weight_scale=ws, out_scale=0.3, padding=1)
    np.testing.assert_array_equal(qkern.qconv2d(x, wt, bias, **kwargs),
                                  qconv2d_reference(x, wt, bias, **kwargs))
    monkeypatch.setattr(_conv_cpu, "_BLOCK_BYTES", 5 * 6 * 9 * 4 * 4 * 2)   # two images a block
    np.testing.assert_array_equal(qkern.qconv2d(x, wt, bias, **kwargs),
                                  qconv2d_reference(x, wt, bias, **kwargs))


def test_many_groups_stacked_matmul():
    x, wt, ws, bias, _ = _problem(5, 2, 6, 6, 1, 2, 40, 3, 3, True, True, "uniform")
    kwargs = dict(act_scale=0.1, weight_scale=ws, out_scale=0.3, padding=1, groups=40)
    np.testing.assert_array_equal(qkern.qconv2d(x, wt, bias, **kwargs),
                                  qconv2d_reference(x, wt, bias, **kwargs))


def test_out_strided_and_poisoned():
    x, wt, ws, bias, _ = _problem(6, 2, 5, 5, 3, 5, 1, 3, 3, False, True, "uniform")
    kwargs = dict(act_scale=0.1, weight_scale=ws, out_scale=0.2, padding=1, relu=True)
    big = np.full((2, 5, 5, 10), 99, dtype=I8)
    out = big[..., ::2]
    res = qkern.qconv2d(x, wt, bias, out=out, **kwargs)
    assert res is out
    np.testing.assert_array_equal(out, qconv2d_reference(x, wt, bias, **kwargs))
    assert (big[..., 1::2] == 99).all()


def test_strided_inputs():
    x, wt, ws, bias, _ = _problem(7, 2, 8, 8, 6, 4, 1, 3, 3, True, False, "uniform")
    xs, ws_ = x[:, ::2, :, ::2], wt[..., ::2]
    kwargs = dict(act_scale=0.1, weight_scale=ws, out_scale=0.2)
    np.testing.assert_array_equal(qkern.qconv2d(xs, ws_, **kwargs),
                                  qconv2d_reference(xs, ws_, **kwargs))


def test_empty_batch():
    y = qkern.qconv2d(np.zeros((0, 4, 4, 3), I8), np.zeros((2, 3, 3, 3), I8), act_scale=1.0,
                      weight_scale=1.0, out_scale=1.0)
    assert y.shape == (0, 2, 2, 2) and y.dtype == I8


X = np.zeros((1, 4, 4, 4), I8)
W = np.zeros((2, 3, 3, 4), I8)
S = dict(act_scale=1.0, weight_scale=1.0, out_scale=1.0)


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((X.astype(np.int16), W), S, TypeError, "x: expected dtype int8"),
    ((X, W.astype(np.uint8)), S, TypeError, "w: expected dtype int8"),
    ((X[0], W), S, ValueError, r"x: expected 4 dimensions"),
    ((X, W[:, :, :, :3]), S, ValueError, "C/groups=4"),
    (([[1]], W), S, TypeError, "x: expected a numpy.ndarray"),
    ((X, W, np.zeros(2, np.float64)), S, TypeError, "bias: expected a float32"),
    ((X, W, np.zeros(3, np.float32)), S, ValueError, r"bias: expected shape \(2,\)"),
    ((X, W), dict(S, act_scale=0.0), ValueError, "act_scale"),
    ((X, W), dict(S, out_scale=float("nan")), ValueError, "out_scale"),
    ((X, W), dict(S, out_scale="1"), TypeError, "out_scale"),
    ((X, W), dict(S, weight_scale=np.ones(3, np.float32)), ValueError,
     r"weight_scale: expected shape \(2,\)"),
    ((X, W), dict(S, weight_scale=np.ones(2, np.float64)), TypeError, "weight_scale"),
    ((X, W), dict(S, weight_scale=np.array([1.0, -1.0], np.float32)), ValueError, "weight_scale"),
    ((X, W), dict(S, act_scale=1e-30, weight_scale=1e-30), ValueError, "underflows"),
    ((X, W), dict(S, out_scale=1e-38, act_scale=1e30), ValueError, "overflows"),
    ((X, W, np.full(2, 1e30, np.float32)), dict(S, act_scale=1e-10), ValueError, "bias /"),
    ((X, W), dict(S, stride=0), ValueError, "stride"),
    ((X, W), dict(S, stride=(1, 1, 1)), TypeError, "stride"),
    ((X, W), dict(S, dilation=True), TypeError, "dilation"),
    ((X, W), dict(S, padding=-1), ValueError, "padding"),
    ((X, W), dict(S, groups=3), ValueError, "groups=3"),
    ((X, W), dict(S, groups=1.0), TypeError, "groups"),
    ((X, W), dict(S, relu=1), TypeError, "relu"),
    ((X, W), dict(S, dilation=3), ValueError, "larger than the padded input"),
    ((X, W), dict(S, stream=0), ValueError, "stream: only for CUDA input"),
    ((X, W), dict(S, out=np.zeros((1, 2, 2, 2), np.int32)), TypeError, "out: expected dtype int8"),
    ((X, W), dict(S, out=np.zeros((1, 2, 2, 3), I8)), ValueError, r"out: expected shape"),
])
def test_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        qkern.qconv2d(*args, **kwargs)


def test_out_overlap_and_readonly():
    x = np.zeros((1, 4, 4, 2), I8)
    w = np.zeros((2, 3, 3, 2), I8)
    with pytest.raises(ValueError, match="out: overlaps x"):
        qkern.qconv2d(x, w, out=x[:, :2, :2, :], **S)
    ro = np.zeros((1, 2, 2, 2), I8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        qkern.qconv2d(x, w, out=ro, **S)
