"""qkern.torch.qconv2d and QConv2d on the CPU: parity with qkern.qconv2d on
the NumPy views (bit for bit) and with PyTorch's own quantized conv, zero
copies, memory formats, quantized tensors, errors, opcheck, torch.compile,
torch.export, the module (from_float, state_dict, copies).

The GPU half (CUDA tensors, streams, the module's device layer, parity with
PyTorch's cuDNN quantized conv) is in test_torch_qconv_gpu.py.
"""

import copy
import io
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import qkern
from qconv_reference import conv_accumulator, qconv2d_reference, requantize, tie_window

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)

# PyTorch 2.13 deprecates quantized tensors (a warning per creation); they still work.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")

CL = torch.channels_last


def _problem(seed, n=2, c=6, h=9, w=8, o=8, k=3, groups=1, per_channel=True, bias=True):
    """NumPy (x NHWC, w OHWI, weight_scale, bias) with values over the whole int8 range."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, h, w, c), dtype=np.int8)
    wt = rng.integers(-128, 128, (o, k, k, c // groups), dtype=np.int8)
    ws = (rng.uniform(1e-3, 1e-2, o).astype(np.float32) if per_channel
          else float(rng.uniform(1e-3, 1e-2)))
    b = (rng.standard_normal(o) * 2).astype(np.float32) if bias else None
    return x, wt, ws, b


def _nchw(a: np.ndarray) -> torch.Tensor:
    """The NCHW-logical channels_last tensor over a fresh copy of NHWC ``a``."""
    return torch.from_numpy(a.copy()).permute(0, 3, 1, 2)


def _t(a):
    return None if a is None else torch.from_numpy(np.asarray(a))


def _nhwc_np(t: torch.Tensor) -> np.ndarray:
    return t.permute(0, 2, 3, 1).numpy()


def _qint8(t: torch.Tensor, scale: float) -> torch.Tensor:
    return torch._make_per_tensor_quantized_tensor(t, scale, 0)


def _qint8_per_channel(t: torch.Tensor, scales: np.ndarray) -> torch.Tensor:
    return torch._make_per_channel_quantized_tensor(
        t, torch.from_numpy(scales).double(), torch.zeros(len(scales), dtype=torch.long), 0)


# ---- the functional op against qkern ------------------------------------------------


@settings(max_examples=40)
@given(n=st.integers(0, 2), h=st.integers(1, 9), w=st.integers(1, 9), cg=st.integers(1, 6),
       og=st.integers(1, 6), groups=st.sampled_from([1, 2, 3]), k=st.integers(1, 4),
       stride=st.integers(1, 2), dilation=st.integers(1, 2), pad=st.integers(0, 2),
       per_channel=st.booleans(), bias=st.booleans(), relu=st.booleans(),
       channels_last=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(n=1, h=5, w=5, cg=3, og=4, groups=1, k=3, stride=1, dilation=1, pad=1, per_channel=False,
         bias=True, relu=True, channels_last=False, seed=0)
def test_matches_qkern_on_the_numpy_views(n, h, w, cg, og, groups, k, stride, dilation, pad,
                                          per_channel, bias, relu, channels_last, seed):
    if min(h, w) + 2 * pad < dilation * (k - 1) + 1:
        return
    x, wt, ws, b = _problem(seed, n, cg * groups, h, w, og * groups, k, groups, per_channel, bias)
    kw = dict(act_scale=0.05, weight_scale=ws, out_scale=0.4, stride=stride, padding=pad,
              dilation=dilation, groups=groups, relu=relu)
    expect = qkern.qconv2d(x, wt, b, **kw)
    np.testing.assert_array_equal(expect, qconv2d_reference(x, wt, b, **kw))
    tx, tw = _nchw(x), _nchw(wt)
    if not channels_last:
        tx, tw = tx.contiguous(), tw.contiguous()
    y = qt.qconv2d(tx, tw, _t(b), **dict(kw, weight_scale=_t(ws) if per_channel else ws))
    assert y.dtype == torch.int8 and y.shape == (n, og * groups) + expect.shape[1:3]
    assert y.is_contiguous(memory_format=CL)
    np.testing.assert_array_equal(_nhwc_np(y), expect)


def _spy_on_qconv2d(monkeypatch) -> list:
    """Make qkern.qconv2d a pass-through that records (x, w, out) addresses
    of each call; returns that record."""
    seen = []
    real = qkern.qconv2d

    def spy(x_np, w_np, bias, **kw):
        seen.append((x_np.ctypes.data, w_np.ctypes.data, kw["out"].ctypes.data))
        return real(x_np, w_np, bias, **kw)

    monkeypatch.setattr(qkern, "qconv2d", spy)
    return seen


def test_zero_copy_both_memory_formats_and_nhwc_tensors(monkeypatch):
    """qkern reads x and w where they are and writes the tensor returned, in any memory format."""
    x, wt, ws, b = _problem(1)
    kw = dict(act_scale=0.05, weight_scale=_t(ws), out_scale=0.3, padding=1)
    expect = qkern.qconv2d(x, wt, b, **dict(kw, weight_scale=ws))
    seen = _spy_on_qconv2d(monkeypatch)
    x_nhwc = torch.from_numpy(x.copy())              # an NHWC tensor: passed as its NCHW view
    cases = {"channels_last": (_nchw(x), _nchw(wt)),
             "contiguous": (_nchw(x).contiguous(), _nchw(wt).contiguous()),
             "NHWC tensor permuted": (x_nhwc.permute(0, 3, 1, 2), _nchw(wt))}
    for name, (tx, tw) in cases.items():
        y = qt.qconv2d(tx, tw, _t(b), **kw)
        assert seen.pop() == (tx.data_ptr(), tw.data_ptr(), y.data_ptr()), name
        assert y.is_contiguous(memory_format=CL), name
        np.testing.assert_array_equal(_nhwc_np(y), expect, err_msg=name)
    assert x_nhwc.permute(0, 3, 1, 2).is_contiguous(memory_format=CL)


def test_strided_slices_and_empty_batch():
    x, wt, ws, b = _problem(2, c=8)
    kw = dict(act_scale=0.05, weight_scale=float(ws[0]), out_scale=0.3)
    tx = _nchw(x)[:, 2:7, 1:, ::2]                    # a channel, row and column slice
    xs = x[:, 1:, ::2, 2:7]
    y = qt.qconv2d(tx, _nchw(wt[..., :5]).contiguous(), **kw)
    np.testing.assert_array_equal(_nhwc_np(y), qconv2d_reference(xs, wt[..., :5], **kw))
    y0 = qt.qconv2d(_nchw(x)[:0], _nchw(wt), **kw)
    assert y0.shape == (0, 8, 7, 6) and y0.is_contiguous(memory_format=CL)


def test_weight_scale_forms_agree():
    """A float, a 0-d tensor and a constant (O,) tensor are the same fp32 arithmetic."""
    x, wt, _, b = _problem(3)
    args = (_nchw(x), _nchw(wt), _t(b))
    kw = dict(act_scale=0.05, out_scale=0.3, padding=(1, 2))
    ys = [qt.qconv2d(*args, weight_scale=s, **kw)
          for s in (0.004, torch.tensor(0.004), torch.full((8,), 0.004))]
    assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], ys[2])
    np.testing.assert_array_equal(
        _nhwc_np(ys[0]), qconv2d_reference(x, wt, b, weight_scale=0.004, act_scale=0.05,
                                           out_scale=0.3, padding=((1, 1), (2, 2))))


# ---- PyTorch's quantized tensors ----------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_quantized_tensors_in_and_out_zero_copy(per_channel, monkeypatch):
    x, wt, ws, b = _problem(4, per_channel=per_channel)
    kw = dict(act_scale=0.05, weight_scale=ws, out_scale=0.25, padding=1, relu=True)
    expect = qkern.qconv2d(x, wt, b, **kw)
    xq = _qint8(_nchw(x), 0.05)
    wq = _qint8_per_channel(_nchw(wt), ws) if per_channel else _qint8(_nchw(wt), ws)
    seen = _spy_on_qconv2d(monkeypatch)
    yq = qt.qconv2d(xq, wq, _t(b), out_scale=0.25, padding=1, relu=True)
    assert seen == [(xq.data_ptr(), wq.data_ptr(), yq.data_ptr())]
    assert yq.dtype == torch.qint8 and yq.qscheme() == torch.per_tensor_affine
    assert (yq.q_scale(), yq.q_zero_point()) == (0.25, 0)
    assert yq.is_contiguous(memory_format=CL)
    np.testing.assert_array_equal(_nhwc_np(yq.int_repr()), expect)
    # A quantized x with a plain int8 w (and its scale) also gives a quantized result.
    mixed = qt.qconv2d(xq, _nchw(wt), _t(b), weight_scale=_t(ws) if per_channel else ws,
                       out_scale=0.25, padding=1, relu=True)
    assert mixed.dtype == torch.qint8 and torch.equal(mixed.int_repr(), yq.int_repr())
    # A plain x with a quantized w gives a plain int8 result.
    plain = qt.qconv2d(_nchw(x), wq, _t(b), act_scale=0.05, out_scale=0.25, padding=1, relu=True)
    assert plain.dtype == torch.int8 and torch.equal(plain, yq.int_repr())


def _quint8(x: np.ndarray, scale: float, zero_point: int) -> torch.Tensor:
    """quint8 NCHW (channels_last) with the same real values as int8 NHWC ``x`` at zero point 0."""
    u8 = (x.astype(np.int16) + zero_point).astype(np.uint8)
    return torch._make_per_tensor_quantized_tensor(_nchw(u8), scale, zero_point)


# (N, C, H, W, O, k, stride, padding, dilation, groups)
TORCH_SHAPES = [(2, 16, 10, 10, 24, 3, 1, 1, 1, 1), (1, 3, 17, 17, 8, 7, 2, 3, 1, 1),
                (2, 64, 8, 8, 32, 1, 1, 0, 1, 1), (1, 32, 9, 9, 32, 3, 2, 1, 1, 32),
                (1, 12, 11, 9, 10, 3, 1, 2, 2, 2), (1, 256, 5, 5, 16, 3, 1, 1, 1, 1)]
ENGINES = [pytest.param(e, marks=() if e in torch.backends.quantized.supported_engines else
                        pytest.mark.skip(reason=f"this PyTorch build has no {e} engine"))
           for e in ("fbgemm", "x86", "onednn", "qnnpack")]


@pytest.mark.parametrize("engine", ENGINES)
def test_parity_with_pytorch_quantized_conv(engine, record_property):
    """``torch.ops.quantized.conv2d`` on this CPU against qkern.torch.qconv2d, with the error
    analysis.

    PyTorch's CPU engines take quint8 activations, so they get the same real
    values as qkern's int8 ``x`` at zero point ``zp`` (``u8 = x + zp``, exact)
    and return quint8 at zero point 128 (``y = u8 - 128``, exact). The
    accumulator is exact in both; what remains is the epilogue:

    - fbgemm folds ``act_scale * weight_scale``, ``/ out_scale`` and
      ``bias / (act_scale * weight_scale)`` in fp32, as qkern does, adds,
      multiplies and rounds half to even: **equal, bit for bit**.
    - oneDNN (``onednn``, and ``x86``, which runs oneDNN for conv here)
      applies the same scales in another order of fp32 operations, and adds
      the output zero point before it rounds: ``round(t + 128)`` in fp32,
      where the grid is ``2**-16`` (at ``t = 0.5000059`` it gave 0, qkern 1).
      A difference of 1 is allowed only where the exact ``t`` lies within
      ``8 * 2**-24 * (|acc| m + |bias| / out_scale) + 2**-17`` of a
      half-integer (``qconv_reference.tie_window``). Per-tensor weight scales here are
      0.004, so that exact ties (``acc * m`` a half-integer) occur.
    - qnnpack first quantizes the bias to int32, ``round(bias / (act_scale *
      weight_scale))``: ``v`` moves by up to 1/2, so ``y`` can differ by 1
      where ``t`` is within ``m / 2`` of a half-integer. It must equal
      qkern's reference run on that integer bias (``acc + round(bias')``, no
      float bias), bit for bit; its differences from qkern are counted.

    fbgemm's depthwise kernels (and, without AVX-512 VNNI, all of fbgemm's
    and oneDNN's int8 kernels) multiply u8 x s8 pairs with ``vpmaddubsw``,
    whose int16 sums saturate above 32767 (at full range, 323 of 3200
    depthwise outputs differed here); there the test keeps ``u8 <= 127``
    (PyTorch's ``reduce_range``), so no sum saturates.
    """
    vnni = qkern.cpu_features().get("avx512_vnni", False)
    torch.backends.quantized.engine, before = engine, torch.backends.quantized.engine
    elements = mismatches = 0
    try:
        for i, (n, c, h, w, o, k, s, p, d, g) in enumerate(TORCH_SHAPES):
            zp, lo, hi = (128, -128, 128) if vnni and g < c else (64, -64, 64)
            conv_kw = dict(stride=s, padding=p, dilation=d, groups=g)
            for variant in range(8):
                per_channel, with_bias, relu = (bool(variant & 1), bool(variant & 2),
                                                bool(variant & 4))
                rng = np.random.default_rng(100 * i + variant)
                x = rng.integers(lo, hi, (n, h, w, c), dtype=np.int8)
                wt = rng.integers(-128, 128, (o, k, k, c // g), dtype=np.int8)
                ws = rng.uniform(1e-3, 1e-2, o).astype(np.float32) if per_channel else 0.004
                bias = (rng.standard_normal(o) * 3).astype(np.float32) if with_bias else None
                out_scale = 0.05 if (i + variant) % 3 == 0 else float(rng.uniform(0.02, 1.0))
                kw = dict(act_scale=0.05, weight_scale=ws, out_scale=out_scale, relu=relu)
                wq = _qint8_per_channel(_nchw(wt), ws) if per_channel else _qint8(_nchw(wt), ws)
                ours = qt.qconv2d(_qint8(_nchw(x), 0.05), wq, _t(bias), out_scale=out_scale,
                                  relu=relu, **conv_kw)
                ours = _nhwc_np(ours.int_repr())
                np.testing.assert_array_equal(ours, qconv2d_reference(x, wt, bias, **kw, **conv_kw))
                packed = torch.ops.quantized.conv2d_prepack(wq, _t(bias), [s, s], [p, p], [d, d],
                                                            g)
                conv = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
                theirs = conv(_quint8(x, 0.05, zp), packed, out_scale, 128)
                theirs = (_nhwc_np(theirs.int_repr()).astype(np.int16) - 128).astype(np.int8)
                label = f"{engine} shape {i} variant {variant}"
                differ = theirs != ours
                if engine == "qnnpack" and bias is not None:
                    acc = conv_accumulator(x, wt, **conv_kw)
                    b_int = np.rint(bias / (np.float32(0.05) * np.float32(ws))).astype(np.int64)
                    np.testing.assert_array_equal(theirs, requantize(acc + b_int, None, **kw),
                                                  err_msg=label)
                elif engine in ("onednn", "x86"):
                    assert (np.abs(theirs.astype(np.int16) - ours) <= 1).all(), label
                    window = tie_window(x, wt, bias, kw, conv_kw, slack=8, absolute=2.0**-17)
                    assert not (differ & ~window).any(), label
                else:
                    np.testing.assert_array_equal(theirs, ours, err_msg=label)
                elements += theirs.size
                mismatches += int(differ.sum())
    finally:
        torch.backends.quantized.engine = before
    record_property("elements", elements)
    record_property("mismatches", mismatches)
    print(f"\n{engine}: {mismatches} of {elements} elements differ from qkern "
          f"(activations {'full int8 except depthwise' if vnni else '7-bit'})")
    assert elements > 0


# ---- argument errors --------------------------------------------------------------


def _args():
    return (torch.zeros(1, 4, 5, 5, dtype=torch.int8), torch.zeros(2, 4, 3, 3, dtype=torch.int8),
            None)


S = dict(act_scale=0.1, weight_scale=0.1, out_scale=0.1)


def _per_channel_w(scales, zero_points, axis=0):
    return torch._make_per_channel_quantized_tensor(
        torch.zeros(2, 4, 3, 3, dtype=torch.int8), torch.tensor(scales, dtype=torch.double),
        torch.tensor(zero_points), axis)


@pytest.mark.parametrize("change, kw, exc, match", [
    (lambda x, w, b: (x.float(), w, b), S, TypeError, "x: expected dtype int8 .or a qint8"),
    (lambda x, w, b: (x.to(torch.uint8), w, b), S, TypeError, "x: expected dtype int8"),
    (lambda x, w, b: (x, w.to(torch.uint8), b), S, TypeError, "w: expected dtype int8"),
    (lambda x, w, b: (x[0], w, b), S, ValueError, r"x: expected shape \(N, C, H, W\)"),
    (lambda x, w, b: (x, w[0], b), S, ValueError, r"w: expected shape \(O, C/groups, kh, kw\)"),
    (lambda x, w, b: (x, w, torch.zeros(2, dtype=torch.float64)), S, TypeError,
     "bias: expected dtype float32"),
    (lambda x, w, b: (x, w, torch.zeros(3)), S, ValueError, r"bias: expected shape \(2,\)"),
    (lambda x, w, b: (x, w, b), dict(S, weight_scale=torch.ones(3)), ValueError,
     r"weight_scale: expected shape \(\) or \(2,\)"),
    (lambda x, w, b: (x, w, b), dict(S, weight_scale=torch.ones(2, dtype=torch.float64)),
     TypeError, "weight_scale: expected dtype float32"),
    (lambda x, w, b: (x, w, b), dict(S, weight_scale=np.ones(2, np.float32)), TypeError,
     "weight_scale: expected a float or a float32 tensor, got ndarray"),
    (lambda x, w, b: (x, w, b), dict(S, out_scale="0.1"), TypeError,
     "out_scale: expected a float, got str"),
    (lambda x, w, b: (x, w, b), dict(S, weight_scale=torch.tensor([1.0, -1.0])), ValueError,
     "weight_scale: expected finite values > 0"),
    (lambda x, w, b: (x, w, b), dict(S, out_scale=0.0), ValueError, "out_scale"),
    (lambda x, w, b: (x, w, b), dict(S, act_scale=None), TypeError,
     "act_scale: required when x is not a quantized tensor"),
    (lambda x, w, b: (x, w, b), dict(S, weight_scale=None), TypeError, "weight_scale: required"),
    (lambda x, w, b: (x, w[:, :3].contiguous(), b), S, ValueError, "C/groups=4"),
    (lambda x, w, b: (x, w, b), dict(S, groups=3), ValueError, "groups=3 must divide"),
    (lambda x, w, b: (x, w, b), dict(S, stride=0), ValueError, "stride"),
    (lambda x, w, b: (x, w, b), dict(S, padding=-1), ValueError, "padding"),
    (lambda x, w, b: (x, w, b), dict(S, dilation=3), ValueError, "larger than the padded input"),
    (lambda x, w, b: (x, w, b), dict(S, relu=1), TypeError, "relu"),
    (lambda x, w, b: (x.to("meta"), w.to("meta"), b), S, ValueError,
     "x: expected a CPU or CUDA tensor, got device meta"),
    (lambda x, w, b: (x, w.to("meta"), b), S, ValueError, "w: on meta, but x is on cpu"),
    (lambda x, w, b: (x.numpy(), w, b), S, TypeError, "x: expected a torch.Tensor"),
    # PyTorch's quantized tensors: qint8, symmetric, per-channel along the output channels.
    (lambda x, w, b: (torch._make_per_tensor_quantized_tensor(x.to(torch.uint8), 0.1, 128), w,
                      b), dict(S, act_scale=None), TypeError, "x: expected a qint8 quantized"),
    (lambda x, w, b: (torch._make_per_tensor_quantized_tensor(x, 0.1, 3), w, b),
     dict(S, act_scale=None), ValueError, "x: expected zero_point 0 .qkern's quantization is "
                                          "symmetric., got 3"),
    (lambda x, w, b: (torch._make_per_tensor_quantized_tensor(x, 0.1, 0), w, b), S, ValueError,
     "act_scale: must be None when x is quantized"),
    (lambda x, w, b: (x, torch._make_per_tensor_quantized_tensor(w, 0.1, -2), b),
     dict(S, weight_scale=None), ValueError, "w: expected zero_point 0"),
    (lambda x, w, b: (x, _per_channel_w([0.1, 0.2], [0, 1]), b), dict(S, weight_scale=None),
     ValueError, "w: expected zero points 0"),
    (lambda x, w, b: (x, _per_channel_w([0.1] * 4, [0] * 4, axis=1), b),
     dict(S, weight_scale=None), ValueError, "w: expected per-channel scales along axis 0"),
    (lambda x, w, b: (torch._make_per_channel_quantized_tensor(
        x, torch.full((4,), 0.1, dtype=torch.double), torch.zeros(4, dtype=torch.long), 1), w, b),
     dict(S, act_scale=None), ValueError, "x: expected a per-tensor quantized tensor"),
])
def test_errors(change, kw, exc, match):
    with pytest.raises(exc, match=match):
        qt.qconv2d(*change(*_args()), **kw)


def test_errors_at_trace_time_when_compiled():
    """The fake implementation checks the geometry as the eager one does."""
    f = torch.compile(qt.qconv2d, backend="eager", fullgraph=True)
    x, w, _ = _args()
    with pytest.raises(Exception, match="larger than the padded input"):
        f(x, w, act_scale=0.1, weight_scale=0.1, out_scale=0.1, dilation=3)


# ---- custom ops: opcheck, fake tensors, torch.compile, torch.export ------------------------


def test_opcheck():
    x, wt, ws, b = _problem(5, groups=2)
    layer = qt.QConv2d(_nchw(wt), _t(b), act_scale=0.05, weight_scale=_t(ws), out_scale=0.3,
                       padding=((0, 1), (2, 1)), groups=2, relu=True)
    conv = torch.ops.qkern.qconv2d.default
    for tx in (_nchw(x), _nchw(x).contiguous()):
        result = torch.library.opcheck(conv, (tx, _nchw(wt), _t(b), 0.05, _t(ws), 0.3, [1, 2],
                                              [0, 1, 2, 1], [1, 1], 2, True))
        assert set(result.values()) == {"SUCCESS"}, result
        result = torch.library.opcheck(torch.ops.qkern.qconv2d_layer.default, (tx, layer._key))
        assert set(result.values()) == {"SUCCESS"}, result


def test_fake_tensors_on_cuda_give_a_channels_last_cuda_result():
    """What the fake implementation tells torch.compile about a CUDA call (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 8, 20, 20, dtype=torch.int8, device="cuda")
        w = torch.empty(16, 8, 3, 3, dtype=torch.int8, device="cuda")
        y = qt.qconv2d(x, w, torch.empty(16, device="cuda"), act_scale=0.1,
                       weight_scale=torch.empty(16), out_scale=0.2, stride=2, padding=1)
        assert y.device == torch.device("cuda", 0) and y.dtype == torch.int8
        assert y.shape == (3, 16, 10, 10) and y.is_contiguous(memory_format=CL)
        with pytest.raises(ValueError, match="w: on cpu, but x is on cuda:0"):
            qt.qconv2d(x, torch.empty(16, 8, 3, 3, dtype=torch.int8), act_scale=0.1,
                       weight_scale=0.1, out_scale=0.2)


def _two_layers(seed):
    x, wt, ws, b = _problem(seed, c=6, o=8, groups=2)
    first = qt.QConv2d(_nchw(wt), _t(b), act_scale=0.05, weight_scale=_t(ws), out_scale=0.3,
                       padding=1, groups=2, relu=True)
    w2 = np.random.default_rng(seed + 1).integers(-128, 128, (4, 8, 3, 3), dtype=np.int8)
    return x, first, torch.from_numpy(w2)


def test_compile_fullgraph_matches_eager_dynamic_batch():
    """An inductor graph holding both convs, compiled once for two batch sizes, equals eager."""
    x, first, w2 = _two_layers(6)

    def f(x):
        return qt.qconv2d(first(x), w2, act_scale=0.3, weight_scale=0.004, out_scale=0.5,
                          stride=2)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    x = np.concatenate([x, x[::-1]] * 2)
    # Sizes unlike any other dimension: dynamo's duck sizing would tie N to an equal
    # one (which the fake implementation specializes), and N = 1 is specialized.
    compiled_for = []
    for n in (7, 5):
        tx = _nchw(x[:n])
        assert torch.equal(compiled(tx), f(tx))
        compiled_for.append(len(graphs))
    assert compiled_for[0] >= 1 and compiled_for[1] == compiled_for[0]   # no recompile for N
    targets = [node.target for node in graphs[-1].graph.nodes]
    assert targets.count(torch.ops.qkern.qconv2d) == 2


def test_export_holds_the_op_and_the_weights():
    x, first, w2 = _two_layers(7)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = first
            self.register_buffer("w2", w2)

        def forward(self, x):
            return qt.qconv2d(self.first(x), self.w2, act_scale=0.3, weight_scale=0.004,
                              out_scale=0.5)

    model, tx = Model(), _nchw(x)
    program = torch.export.export(model, (tx,))
    targets = [node.target for node in program.graph.nodes]
    assert targets.count(torch.ops.qkern.qconv2d.default) == 2
    assert torch.equal(program.module()(tx), model(tx))
    assert "first.weight" in program.state_dict and "w2" in program.state_dict


# ---- the QConv2d module ----------------------------------------------------------------


@pytest.mark.parametrize("padding", [1, "same", "valid"])
def test_from_float_within_the_quantization_bound(padding):
    """The layer against the float conv of the same (dequantized) input, evaluated in float64.

    With W the float weight, Ŵ = q * s (|W - Ŵ| <= s / 2 per element, s per
    output channel), x_r = x * act_scale the real input and b the bias, the
    layer's real output y * out_scale differs from W * x_r + b by at most

        s/2 * Σ|x_r| (over the receptive field) + out_scale / 2 (rounding)

    plus the fp32 epilogue's error, a few ulp of t (bounded by 2**-20 * |t|
    here), except where the result saturates (left out). It also equals
    qkern.qconv2d on its own quantized weight, exactly.
    """
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 10, (3, 5), padding=padding, dilation=(2, 1), bias=True)
    with torch.no_grad():
        conv.weight[3] = 0                          # a channel of zeros: scale 1, weights 0
    act_scale, out_scale = 0.02, 0.01
    layer = qt.QConv2d.from_float(conv, act_scale, out_scale)
    s = layer.weight_scale.double()
    assert s[3] == 1 and (layer.weight[3] == 0).all()
    w_hat = layer.weight.double() * s[:, None, None, None]
    assert (torch.abs(conv.weight.double() - w_hat) <= s[:, None, None, None] / 2).all()
    x = torch.randint(-128, 128, (2, 6, 13, 12), dtype=torch.int8)
    y = layer(x)
    x_r = x.double() * act_scale
    exact = torch.nn.functional.conv2d(x_r, conv.weight.double(), conv.bias.double(),
                                       padding=layer.padding[::2] if padding != "same" else 0,
                                       dilation=(2, 1)) if padding != "same" else None
    if padding == "same":
        padded = torch.nn.functional.pad(x_r, (layer.padding[2], layer.padding[3],
                                               layer.padding[0], layer.padding[1]))
        exact = torch.nn.functional.conv2d(padded, conv.weight.double(), conv.bias.double(),
                                           dilation=(2, 1))
        assert exact.shape[2:] == x.shape[2:]
    l1 = torch.nn.functional.conv2d(
        torch.nn.functional.pad(x_r.abs(), (layer.padding[2], layer.padding[3],
                                             layer.padding[0], layer.padding[1])),
        torch.ones(1, 6, 3, 5, dtype=torch.float64), dilation=(2, 1))
    bound = l1 * s[None, :, None, None] / 2 + out_scale / 2 + 2.0**-20 * exact.abs()
    real = y.double() * out_scale
    inside = (y > -128) & (y < 127)
    assert inside.float().mean() > 0.5
    err = (real - exact).abs()
    assert (err[inside] <= bound[inside]).all(), float((err - bound)[inside].max())
    np.testing.assert_array_equal(
        _nhwc_np(y), qkern.qconv2d(_nhwc_np(x), _nhwc_np(layer.weight), conv.bias.detach().numpy(),
                                   act_scale=act_scale, weight_scale=s.float().numpy(),
                                   out_scale=out_scale, padding=((layer.padding[0],
                                                                  layer.padding[1]),
                                                                 (layer.padding[2],
                                                                  layer.padding[3])),
                                   dilation=(2, 1)))


def test_from_float_same_padding_is_pytorchs():
    conv = torch.nn.Conv2d(2, 2, (4, 3), padding="same", dilation=(1, 3))
    assert qt.QConv2d.from_float(conv, 0.1, 0.1).padding == [1, 2, 3, 3]
    with pytest.raises(ValueError, match="padding_mode 'zeros'"):
        qt.QConv2d.from_float(torch.nn.Conv2d(2, 2, 3, padding_mode="reflect"), 0.1, 0.1)
    with pytest.raises(TypeError, match="conv: expected a torch.nn.Conv2d"):
        qt.QConv2d.from_float(torch.nn.Linear(2, 2), 0.1, 0.1)


def test_module_forward_equals_the_functional_op_and_takes_quantized_input():
    x, wt, ws, b = _problem(8, groups=2)
    layer = qt.QConv2d(_nchw(wt).contiguous(), _t(b), act_scale=0.05, weight_scale=_t(ws),
                       out_scale=0.3, stride=(1, 2), padding=1, groups=2)
    assert layer.weight.is_contiguous(memory_format=CL)
    expect = qt.qconv2d(_nchw(x), _nchw(wt), _t(b), act_scale=0.05, weight_scale=_t(ws),
                        out_scale=0.3, stride=(1, 2), padding=1, groups=2)
    assert torch.equal(layer(_nchw(x)), expect)
    yq = layer(_qint8(_nchw(x), 0.05))
    assert yq.dtype == torch.qint8 and yq.q_scale() == 0.3 and torch.equal(yq.int_repr(), expect)
    with pytest.raises(ValueError, match="quantized with scale 0.5, but the layer's act_scale"):
        layer(_qint8(_nchw(x), 0.5))
    assert (layer.in_channels, layer.out_channels, layer.kernel_size) == (6, 8, (3, 3))
    assert list(layer.parameters()) == []


def test_module_bad_arguments():
    w = torch.zeros(4, 2, 3, 3, dtype=torch.int8)
    with pytest.raises(TypeError, match="weight: expected a torch.Tensor"):
        qt.QConv2d(w.numpy(), act_scale=0.1, weight_scale=0.1, out_scale=0.1)
    with pytest.raises(TypeError, match="w: expected dtype int8"):
        qt.QConv2d(w.float(), act_scale=0.1, weight_scale=0.1, out_scale=0.1)
    with pytest.raises(ValueError, match=r"bias: expected shape \(4,\)"):
        qt.QConv2d(w, torch.zeros(3), act_scale=0.1, weight_scale=0.1, out_scale=0.1)
    with pytest.raises(ValueError, match="groups=3 must divide"):
        qt.QConv2d(w, act_scale=0.1, weight_scale=0.1, out_scale=0.1, groups=3)
    with pytest.raises(ValueError, match="act_scale"):
        qt.QConv2d(w, act_scale=-1.0, weight_scale=0.1, out_scale=0.1)
    with pytest.raises(ValueError, match="weight_scale: expected finite values > 0"):
        qt.QConv2d(w, act_scale=0.1, weight_scale=torch.zeros(4), out_scale=0.1)
    layer = qt.QConv2d(w, act_scale=0.1, weight_scale=0.1, out_scale=0.1)
    with pytest.raises(ValueError, match=r"C/groups=3 \(C=3, groups=1\)"):
        layer(torch.zeros(1, 3, 5, 5, dtype=torch.int8))
    # Module.half() converts the float32 buffers: rejected, not computed in float16.
    with pytest.raises(TypeError, match="weight_scale: expected dtype float32, got torch.float16"):
        layer.half()(torch.zeros(1, 2, 5, 5, dtype=torch.int8))


def test_state_dict_round_trip():
    x, first, _ = _two_layers(9)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    state = torch.load(io.BytesIO(buf.getvalue()))        # weights_only: plain types suffice
    assert sorted(state) == ["_extra_state", "bias", "weight", "weight_scale"]
    assert state["_extra_state"] == {"act_scale": 0.05, "out_scale": 0.3}
    _, other, _ = _two_layers(10)
    other.set_extra_state({"act_scale": 0.07, "out_scale": 0.2})
    tx = _nchw(x)
    assert not torch.equal(other(tx), first(tx))
    other.load_state_dict(state)
    assert (other.act_scale, other.out_scale) == (0.05, 0.3)
    assert other.weight.is_contiguous(memory_format=CL)
    assert torch.equal(other(tx), first(tx))


def test_load_state_dict_errors():
    _, layer, _ = _two_layers(11)
    state = layer.state_dict()
    with pytest.raises(RuntimeError, match="dtype mismatch for weight: expected torch.int8"):
        layer.load_state_dict({**state, "weight": state["weight"].float()})
    with pytest.raises(RuntimeError, match="size mismatch for weight_scale"):
        layer.load_state_dict({**state, "weight_scale": torch.tensor(0.1)})
    with pytest.raises(RuntimeError, match='Missing key.*"_extra_state"'):
        layer.load_state_dict({k: v for k, v in state.items() if k != "_extra_state"})
    no_bias = qt.QConv2d(layer.weight, act_scale=0.05, weight_scale=layer.weight_scale,
                         out_scale=0.3, groups=2)
    with pytest.raises(RuntimeError, match='Unexpected key.*"bias"'):
        no_bias.load_state_dict(state)


def test_copies_and_repr():
    x, layer, _ = _two_layers(12)
    tx = _nchw(x)
    expect = layer(tx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copies = [copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))]
    assert len({layer._key} | {c._key for c in copies}) == 3
    key = layer._key
    del layer
    for c in copies:
        assert torch.equal(c(tx), expect)
        assert torch.equal(torch.ops.qkern.qconv2d_layer(tx, c._key), expect)
    with pytest.raises(RuntimeError, match=f"no live qkern.torch.QConv2d with key '{key}'"):
        torch.ops.qkern.qconv2d_layer(tx, key)
    assert repr(copies[0]) == (
        "QConv2d(6, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1), "
        "dilation=(1, 1), groups=2, bias=True, relu=True, act_scale=0.05, out_scale=0.3, "
        "per_channel=True)")
