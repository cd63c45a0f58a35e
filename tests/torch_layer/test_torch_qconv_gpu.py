"""qkern.torch.qconv2d and QConv2d on CUDA tensors: the cuDNN path against
the exact reference, in-place output on torch's current stream, the module's
device layer (built once, reused, rebuilt when its buffers change), quantized
CUDA tensors, torch.compile, and parity with PyTorch's own cuDNN quantized
conv (``torch.ops.quantized.conv2d`` on CUDA) where this PyTorch has it.

Marked ``gpu``; skips as a whole, with the reason, where PyTorch sees no
CUDA device or qkern's GPU path cannot run (benchmarks/gpu_check.py runs it
on a GPU). The tolerance against the reference is gpu_support.compare's.
"""

import numpy as np
import pytest

import qkern.cudnn
from gpu_support import compare, report
from qconv_reference import qconv2d_reference, tie_window

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
if not torch.cuda.is_available():
    pytest.skip(f"no GPU path here: PyTorch {torch.__version__} sees no CUDA device",
                allow_module_level=True)
REASON = qkern.cudnn.unavailable_reason()
if REASON is not None:
    pytest.skip(f"no GPU path here: {REASON}", allow_module_level=True)

import qkern.torch as qt  # noqa: E402

CL = torch.channels_last


def _problem(seed, n, c, h, w, o, k, groups, per_channel, bias):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, h, w, c), dtype=np.int8)
    wt = rng.integers(-128, 128, (o, k, k, c // groups), dtype=np.int8)
    ws = rng.uniform(1e-3, 1e-2, o).astype(np.float32) if per_channel else 0.004
    b = (rng.standard_normal(o) * 2).astype(np.float32) if bias else None
    return x, wt, ws, b


def _cuda(a: np.ndarray) -> torch.Tensor:
    """NHWC (or OHWI) ``a`` as an NCHW-logical (OIHW) channels_last CUDA tensor."""
    return torch.from_numpy(np.ascontiguousarray(a)).cuda().permute(0, 3, 1, 2)


def _host_nhwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(0, 2, 3, 1).cpu().numpy()


def _full_kw(kw):
    """``kw`` with stride, padding and dilation as compare() reads them."""
    p = kw.get("padding", 0)
    return dict(kw, stride=(kw.get("stride", 1),) * 2, dilation=(kw.get("dilation", 1),) * 2,
                padding=((p, p), (p, p)), groups=kw.get("groups", 1), relu=kw.get("relu", False))


# (N, C, H, W, O, k, groups): C and O multiples of 4 or not, grouped, depthwise.
SHAPES = [(2, 16, 12, 12, 32, 3, 1), (1, 3, 15, 15, 8, 7, 1), (2, 6, 9, 9, 10, 3, 2),
          (1, 32, 8, 8, 32, 3, 32), (3, 64, 7, 7, 64, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_functional_matches_reference(shape, channels_last):
    n, c, h, w, o, k, g = shape
    for variant in range(4):
        per_channel, bias = bool(variant & 1), bool(variant & 2)
        x, wt, ws, b = _problem(variant, n, c, h, w, o, k, g, per_channel, bias)
        kw = dict(act_scale=0.05, weight_scale=ws, out_scale=0.2, stride=1 + variant % 2,
                  padding=k // 2, groups=g, relu=variant == 3)
        tx, tw = _cuda(x), _cuda(wt)
        if not channels_last:
            tx, tw = tx.contiguous(), tw.contiguous()
        y = qt.qconv2d(tx, tw, None if b is None else torch.from_numpy(b).cuda(),
                       **dict(kw, weight_scale=torch.from_numpy(ws) if per_channel else ws))
        assert y.device == tx.device and y.dtype == torch.int8
        assert y.is_contiguous(memory_format=CL)
        compare(_host_nhwc(y), qconv2d_reference(x, wt, b, **kw), x, wt, b, _full_kw(kw),
                "torch functional")


def test_writes_the_torch_output_in_place_on_the_current_stream(monkeypatch):
    x, wt, _, b = _problem(1, 2, 16, 20, 20, 16, 3, 1, False, True)
    kw = dict(act_scale=0.05, weight_scale=0.004, out_scale=0.2, padding=1)
    seen = []
    real = qkern.qconv2d

    def spy(x_v, w_v, bias, **kw):
        seen.append((x_v.data_ptr(), kw["out"].data_ptr(), kw["stream"]))
        return real(x_v, w_v, bias, **kw)

    monkeypatch.setattr(qkern, "qconv2d", spy)
    tx = _cuda(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = qt.qconv2d(tx, _cuda(wt), torch.from_numpy(b), **kw)
    side.synchronize()
    (x_ptr, out_ptr, stream), = seen
    assert x_ptr == tx.data_ptr() and out_ptr == y.data_ptr()          # no copies
    assert stream.cuda_stream == side.cuda_stream
    compare(_host_nhwc(y), qconv2d_reference(x, wt, b, **kw), x, wt, b, _full_kw(kw),
            "torch stream")


def test_module_keeps_its_device_layer():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1)
    layer = qt.QConv2d.from_float(conv, act_scale=0.05, out_scale=0.1, relu=True)
    x = torch.randint(-128, 128, (2, 16, 14, 14), dtype=torch.int8)
    expect = layer(x)                                     # the CPU path
    layer = layer.cuda()
    tx = x.cuda().contiguous(memory_format=CL)
    before = qkern.cudnn.plan_cache_info()
    y = layer(tx)
    device_layer = layer._cudnn[1]
    assert device_layer._w_ptr == layer.weight.data_ptr()      # the buffer, read in place
    assert torch.equal(layer(tx), y) and layer._cudnn[1] is device_layer
    assert qkern.cudnn.plan_cache_info().hits > before.hits
    kw = dict(act_scale=0.05, weight_scale=layer.weight_scale.cpu().numpy(), out_scale=0.1,
              padding=1, relu=True)
    xn, wn, bn = _host_nhwc(x), _host_nhwc(layer.weight), conv.bias.detach().numpy()
    compare(_host_nhwc(y), _host_nhwc(expect), xn, wn, bn, _full_kw(kw), "torch module")
    report({"test": "torch module plan",
            **{k: v for k, v in device_layer.last_plan.items() if k != "json"}})
    with torch.no_grad():
        layer.weight.neg_()                               # in place: the version counter moves
    y2 = layer(tx)
    assert layer._cudnn[1] is not device_layer
    expect2 = qkern.qconv2d(xn, -wn, bn, **kw)
    compare(_host_nhwc(y2), expect2, xn, -wn, bn, _full_kw(kw), "torch module rebuilt")


def test_quantized_cuda_tensors():
    x, wt, ws, b = _problem(2, 1, 8, 10, 10, 12, 3, 1, True, True)
    kw = dict(act_scale=0.05, weight_scale=ws, out_scale=0.3, padding=1)
    xq = torch._make_per_tensor_quantized_tensor(_cuda(x), 0.05, 0)
    wq = torch._make_per_channel_quantized_tensor(
        _cuda(wt), torch.from_numpy(ws).double().cuda(), torch.zeros(12, dtype=torch.long).cuda(),
        0)
    yq = qt.qconv2d(xq, wq, torch.from_numpy(b), out_scale=0.3, padding=1)
    assert yq.is_cuda and yq.dtype == torch.qint8 and yq.q_scale() == 0.3
    compare(_host_nhwc(yq.int_repr()), qconv2d_reference(x, wt, b, **kw), x, wt, b, _full_kw(kw),
            "torch quantized")


def test_compile_fullgraph_matches_eager():
    torch.manual_seed(1)
    layer = qt.QConv2d.from_float(torch.nn.Conv2d(8, 16, 3, padding=1), 0.05, 0.1).cuda()
    w2 = torch.randint(-128, 128, (8, 16, 1, 1), dtype=torch.int8, device="cuda")

    def f(x):
        return qt.qconv2d(layer(x), w2, act_scale=0.1, weight_scale=0.004, out_scale=0.2)

    compiled = torch.compile(f, fullgraph=True)
    x = torch.randint(-128, 128, (2, 8, 12, 12), dtype=torch.int8, device="cuda")
    assert torch.equal(compiled(x), f(x))


def test_parity_with_pytorch_cudnn_quantized_conv():
    """``torch.ops.quantized.conv2d`` on CUDA (PyTorch's cuDNN int8 graph) against qkern.torch.

    Both run cuDNN's conv -> add -> ReLU -> mul graph (per-tensor weights: the
    only kind PyTorch's cuDNN path takes); PyTorch folds its constants from
    double scales (``act_scale * weight_scale / out_scale``, and the bias
    times ``1 / (act_scale * weight_scale)``), qkern in fp32: each side is
    within a few fp32 roundings of the exact ``t``, so a difference of 1 is
    allowed only where ``t`` is within ``8 * 2**-24 * (|acc| m + |bias| /
    out_scale)`` of a half-integer (qconv_reference.tie_window).
    """
    try:
        probe = torch._make_per_tensor_quantized_tensor(
            torch.zeros(1, 4, 4, 4, dtype=torch.int8, device="cuda"), 0.1, 0)
        packed = torch.ops.quantized.conv2d_prepack(
            torch._make_per_tensor_quantized_tensor(torch.zeros(4, 4, 1, 1, dtype=torch.int8,
                                                                device="cuda"), 0.1, 0),
            None, [1, 1], [0, 0], [1, 1], 1)
        torch.ops.quantized.conv2d(probe.contiguous(memory_format=CL), packed, 0.1, 0)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this PyTorch has no CUDA quantized conv: {str(e).splitlines()[0][:160]}")
    elements = mismatches = 0
    for i, (n, c, h, w, o, k) in enumerate([(2, 16, 14, 14, 32, 3), (1, 64, 8, 8, 64, 1),
                                             (2, 8, 11, 11, 16, 5)]):
        for relu in (False, True):
            x, wt, _, b = _problem(10 + i, n, c, h, w, o, k, 1, False, True)
            kw = dict(act_scale=0.05, weight_scale=0.004, out_scale=0.2)
            xq = torch._make_per_tensor_quantized_tensor(_cuda(x), 0.05, 0)
            wq = torch._make_per_tensor_quantized_tensor(_cuda(wt), 0.004, 0)
            ours = qt.qconv2d(xq, wq, torch.from_numpy(b), out_scale=0.2, padding=k // 2,
                              relu=relu)
            packed = torch.ops.quantized.conv2d_prepack(wq, torch.from_numpy(b).cuda(), [1, 1],
                                                        [k // 2] * 2, [1, 1], 1)
            conv = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
            theirs = conv(xq.contiguous(memory_format=CL), packed, 0.2, 0)
            ours, theirs = _host_nhwc(ours.int_repr()), _host_nhwc(theirs.int_repr())
            differ = ours != theirs
            assert (np.abs(ours.astype(np.int16) - theirs) <= 1).all()
            p = k // 2
            window = tie_window(x, wt, b, kw, dict(padding=((p, p), (p, p))), slack=8)
            assert not (differ & ~window).any(), f"shape {i} relu {relu}"
            elements += differ.size
            mismatches += int(differ.sum())
    report({"test": "torch cudnn parity", "elements": elements, "mismatches": mismatches})
