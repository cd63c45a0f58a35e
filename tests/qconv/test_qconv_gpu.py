"""qkern.qconv2d and QConv2d on a GPU: the cuDNN graph against the exact
reference, the frontend cross-check, rounding/saturation, plans, interop.

Every test here is marked ``gpu`` and skips, with the reason, where no CUDA
device, cuda.core or cuDNN is available; those skips are expected on CPU
machines and in CI (see benchmarks/gpu_check.py, which runs them on a GPU).

Tolerance (gpu_support.compare): equal to the reference except by 1 where
``t = v * m`` lies within fp32 rounding of a half-integer; the mismatch rate
is written to $QKERN_GPU_REPORT (JSON lines) when set.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qkern.cudnn
from gpu_support import compare, report
from qconv_reference import qconv2d_reference

pytestmark = pytest.mark.gpu

REASON = qkern.cudnn.unavailable_reason()
if REASON is not None:
    pytest.skip(f"no GPU path here: {REASON}", allow_module_level=True)

from qkern.cudnn import _device  # noqa: E402

DEV = _device.require_device(0)
STREAM = DEV.default_stream
EXAMPLES = int(os.environ.get("QKERN_GPU_EXAMPLES", "200"))


def to_device(a: np.ndarray):
    a = np.ascontiguousarray(a)
    buf = _device.allocate(DEV, a.nbytes, STREAM)
    _device.upload(a, _device.buffer_ptr(buf), STREAM)
    return _device.DeviceArray(buf, a.shape, 0, STREAM)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 3), h=st.integers(1, 14), w=st.integers(1, 14), cg=st.integers(1, 20),
    og=st.integers(1, 20), groups=st.sampled_from([1, 1, 1, 2, 4]), k=st.sampled_from([1, 3, 5, 7]),
    stride=st.integers(1, 2), dilation=st.integers(1, 2), pad=st.integers(0, 3),
    per_channel=st.booleans(), with_bias=st.booleans(), relu=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_matches_reference(n, h, w, cg, og, groups, k, stride, dilation, pad, per_channel,
                           with_bias, relu, seed):
    if h + 2 * pad < dilation * (k - 1) + 1 or w + 2 * pad < dilation * (k - 1) + 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, h, w, cg * groups), dtype=np.int8)
    wt = rng.integers(-128, 128, (og * groups, k, k, cg), dtype=np.int8)
    ws = rng.uniform(1e-3, 1e-2, og * groups).astype(np.float32) if per_channel else 0.004
    bias = rng.standard_normal(og * groups).astype(np.float32) if with_bias else None
    kw = dict(act_scale=0.05, weight_scale=ws, out_scale=float(rng.uniform(0.05, 1.0)),
              stride=(stride, stride), padding=((pad, pad), (pad, pad)),
              dilation=(dilation, dilation), groups=groups, relu=relu)
    y = qkern.qconv2d(to_device(x), wt, bias, **kw).to_numpy()
    compare(y, qconv2d_reference(x, wt, bias, **kw), x, wt, bias, kw, "hypothesis")


def test_layer_plans_are_cached_and_recorded():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (2, 16, 16, 32), dtype=np.int8)
    w = rng.integers(-128, 128, (64, 3, 3, 32), dtype=np.int8)
    layer = qkern.cudnn.QConv2d(w, np.ones(64, np.float32), act_scale=0.05, weight_scale=0.004,
                                out_scale=0.3, padding=1, relu=True)
    before = qkern.cudnn.plan_cache_info()
    y1 = layer(to_device(x)).to_numpy()
    y2 = layer(to_device(x)).to_numpy()
    after = qkern.cudnn.plan_cache_info()
    assert after.hits >= before.hits + 1
    np.testing.assert_array_equal(y1, y2)
    assert layer.last_plan["form"] in ("virtual", "inplace") and layer.last_plan["engine"] >= 0
    report({"test": "plan", **{k: v for k, v in layer.last_plan.items() if k != "json"}})


def test_autotune_and_out():
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (1, 28, 28, 64), dtype=np.int8)
    w = rng.integers(-128, 128, (64, 3, 3, 64), dtype=np.int8)
    kw = dict(act_scale=0.05, weight_scale=0.004, out_scale=0.5, padding=1)
    layer = qkern.cudnn.QConv2d(w, autotune=True, **kw)
    out = to_device(np.full((1, 28, 28, 64), 99, np.int8))
    assert layer(to_device(x), out=out) is out
    ref = qconv2d_reference(x, w, **kw)
    full = dict(kw, weight_scale=0.004, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1),
                groups=1, relu=False)
    compare(out.to_numpy(), ref, x, w, None, full, "autotune")


def test_rounding_and_saturation_probe():
    # 1x1 conv, one channel, w = 1: acc = x exactly.  m = 0.5 puts every odd x on a tie;
    # m = 4 pushes |x| >= 32 out of int8 range.
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 256, 1).repeat(4, axis=3)
    w = np.zeros((4, 1, 1, 4), np.int8)
    w[np.arange(4), 0, 0, np.arange(4)] = 1
    ties = qkern.qconv2d(to_device(x), w, act_scale=1.0, weight_scale=1.0, out_scale=2.0).to_numpy()
    t = np.arange(-128, 128) / 2
    half_even = np.rint(t)
    half_away = np.sign(t) * np.floor(np.abs(t) + 0.5)
    got = ties[0, 0, :, 0].astype(np.float64)
    mode = ("half-to-even" if (got == half_even).all() else
            "half-away-from-zero" if (got == half_away).all() else
            "truncate" if (got == np.trunc(t)).all() else "other")
    big = qkern.qconv2d(to_device(x), w, act_scale=1.0, weight_scale=4.0, out_scale=1.0).to_numpy()
    expect_sat = np.clip(np.arange(-128, 128) * 4, -128, 127)
    saturates = bool((big[0, 0, :, 0] == expect_sat).all())
    report({"test": "rounding", "mode": mode, "saturates": saturates,
            "ties": got[::32].tolist()})
    assert mode in ("half-to-even", "half-away-from-zero"), got
    assert saturates, big[0, 0, :, 0]


def test_frontend_bit_for_bit():
    torch = pytest.importorskip("torch")
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    import frontend_graph

    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 20, 20, 32), dtype=np.int8)
    w = rng.integers(-128, 128, (48, 3, 3, 32), dtype=np.int8)
    ws = rng.uniform(1e-3, 1e-2, 48).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    kw = dict(act_scale=0.05, weight_scale=ws, out_scale=0.2, padding=1, relu=True)
    ep = qkern._conv_spec.epilogue_constants(48, bias, act_scale=0.05, weight_scale=ws,
                                             out_scale=0.2, relu=True)
    cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    run = frontend_graph.build(torch, cuda(x), cuda(w), cuda(ep.bias), cuda(ep.multiplier),
                               stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), relu=True)
    theirs = run().cpu().numpy()
    ours = qkern.qconv2d(to_device(x), w, bias, **kw).to_numpy()
    report({"test": "frontend", "elements": int(ours.size),
            "mismatches": int((ours != theirs).sum())})
    np.testing.assert_array_equal(ours, theirs)


def test_interop_with_torch_and_cupy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (1, 8, 8, 8), dtype=np.int8)
    w = rng.integers(-128, 128, (8, 3, 3, 8), dtype=np.int8)
    kw = dict(act_scale=0.05, weight_scale=0.004, out_scale=0.3, padding=1)
    ref = qconv2d_reference(x, w, **kw)
    y = qkern.qconv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), **kw,
                      stream=torch.cuda.current_stream())
    np.testing.assert_array_equal(torch.from_dlpack(y).cpu().numpy(), ref)
    cupy = pytest.importorskip("cupy")
    y2 = qkern.qconv2d(cupy.asarray(x), w, **kw)
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(y2)), ref)
