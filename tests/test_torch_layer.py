"""qkern.torch: the custom ops (zero-copy, shapes, errors, opcheck, torch.compile,
torch.export), quantize_per_channel, WoqLinear (state_dict, copies, memory) and
swap_linears on a small MLP against the float model under a derived bound.

Parity of the op with torch._weight_int8pack_mm over a hypothesis sweep is in
test_torch_parity.py.
"""

import copy
import gc
import io
import pickle

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import qkern
from reference import BF16, DTYPES, U_OUT, assert_woq_close, woq_bound

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import TORCH_DTYPES, to_numpy, to_torch  # noqa: E402

DTYPE_IDS = [d.name for d in DTYPES]


def _problem(dtype, m=5, n=24, k=48, seed=0):
    """(x, w, scales) as NumPy arrays in ``dtype``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.001, 0.02, n).astype(dtype)
    return x, w, s


def _bits(t: torch.Tensor) -> np.ndarray:
    return to_numpy(t).view(np.uint8)


# ---- the functional op ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_op_is_zero_copy(dtype, monkeypatch):
    """qkern reads the tensors' own memory and writes the tensor that is returned."""
    x, w, s = _problem(dtype, m=6, k=64)
    tw, ts = to_torch(w), to_torch(s)
    wide = to_torch(np.concatenate([x, x[:, :16]], axis=1))
    cases = {"contiguous": to_torch(x),
             "row-strided slice": wide[:, :64],      # rows 80 elements apart
             "every other row": to_torch(np.repeat(x, 2, axis=0))[::2]}
    seen = []
    real = qkern.weight_int8pack_mm

    def spy(x_np, w_np, s_np, **kw):
        seen.append((x_np.ctypes.data, w_np.ctypes.data, s_np.ctypes.data,
                     kw["out"].ctypes.data))
        return real(x_np, w_np, s_np, **kw)

    monkeypatch.setattr(qkern, "weight_int8pack_mm", spy)
    expect = real(x, w, s)
    for name, tx in cases.items():
        y = qt.weight_int8pack_mm(tx, tw, ts)
        assert seen.pop() == (tx.data_ptr(), tw.data_ptr(), ts.data_ptr(), y.data_ptr()), name
        assert y.is_contiguous() and np.array_equal(_bits(y), expect.view(np.uint8)), name


def test_op_any_strides_batch_dims_k_tails_and_empty():
    x, w, s = _problem(BF16, m=6, n=10, k=33)  # K % 16 != 0: no problem for qkern
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    expect = qkern.weight_int8pack_mm(x, w, s)
    assert_woq_close(expect, x, w, s, daz=True)
    # x with a non-unit last stride (qkern copies it), and with batch dimensions.
    x_t = to_torch(np.ascontiguousarray(x.T)).t()
    assert not x_t.is_contiguous()
    assert np.array_equal(_bits(qt.weight_int8pack_mm(x_t, tw, ts)), expect.view(np.uint8))
    y3 = qt.weight_int8pack_mm(tx.reshape(2, 3, 33), tw, ts)
    assert y3.shape == (2, 3, 10)
    assert np.array_equal(_bits(y3.reshape(6, 10)), expect.view(np.uint8))
    assert qt.weight_int8pack_mm(tx[:0], tw, ts).shape == (0, 10)
    assert qt.weight_int8pack_mm(tx, tw[:0], ts[:0]).shape == (6, 0)
    y0 = qt.weight_int8pack_mm(tx[:, :0], tw[:, :0].contiguous(), ts)
    assert y0.shape == (6, 10) and (y0 == 0).all()


def test_op_needs_no_autograd_and_runs_on_inputs_that_require_grad():
    x, w, s = _problem(np.dtype(np.float32))
    tx = to_torch(x).requires_grad_()
    y = qt.weight_int8pack_mm(tx, to_torch(w), to_torch(s))
    assert np.array_equal(_bits(y), qkern.weight_int8pack_mm(x, w, s).view(np.uint8))
    with pytest.raises(RuntimeError, match="no autograd formula"):
        y.sum().backward()


def _ok():
    return (torch.ones(2, 4), torch.ones(3, 4, dtype=torch.int8), torch.ones(3))


@pytest.mark.parametrize("change, exc, match", [
    (lambda x, w, s: (x.double(), w, s.double()), TypeError, "x: expected dtype float32, float16"),
    (lambda x, w, s: (x.to(torch.int8), w, s.to(torch.int8)), TypeError, "x: expected dtype"),
    (lambda x, w, s: (x, w, s.half()), TypeError, r"scales: expected dtype torch.float32 \(the"),
    (lambda x, w, s: (x, w.float(), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, w.to(torch.uint8), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, w[0], s), ValueError, r"w: expected shape \(N, K\)"),
    (lambda x, w, s: (x, torch.ones(4, 3, dtype=torch.int8).t(), s), ValueError,
     "w: expected a contiguous"),
    (lambda x, w, s: (x, w, torch.ones(2)), ValueError, r"scales: expected shape \(3,\)"),
    (lambda x, w, s: (x, w, torch.ones(3, 1)), ValueError, r"scales: expected shape \(3,\)"),
    (lambda x, w, s: (torch.ones(2, 5), w, s), ValueError, "x: expected last dimension K=4"),
    (lambda x, w, s: (torch.tensor(1.0), w, s), ValueError, "x: expected shape"),
    (lambda x, w, s: (x.to("meta"), w, s), ValueError, "x: expected a CPU tensor, got device meta"),
    (lambda x, w, s: (x, w.to("meta"), s), ValueError, "w: expected a CPU tensor"),
    (lambda x, w, s: (x, w, s.to("meta")), ValueError, "scales: expected a CPU tensor"),
])
def test_op_bad_arguments(change, exc, match):
    with pytest.raises(exc, match=match):
        qt.weight_int8pack_mm(*change(*_ok()))


def test_op_bad_arguments_raise_when_compiled_too():
    """The fake implementation checks as the eager one does, at trace time."""
    f = torch.compile(qt.weight_int8pack_mm, backend="eager", fullgraph=True)
    x, w, s = _ok()
    with pytest.raises(Exception, match="x: expected last dimension K=4"):
        f(torch.ones(2, 5), w, s)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_opcheck(dtype):
    """Schema, fake tensor, autograd registration and AOT dispatch of both ops."""
    x, w, s = _problem(dtype)
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    layer = qt.WoqLinear(tw, ts)
    strided = (tx.reshape(5, 2, 24)[:, 1], tw[:, :24].contiguous(), ts)  # rows 48 apart
    mm, linear = torch.ops.qkern.weight_int8pack_mm.default, torch.ops.qkern.woq_linear.default
    for op, args in [(mm, (tx, tw, ts)), (mm, strided), (linear, (tx, layer._key))]:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result


# ---- torch.compile and torch.export ------------------------------------------


def test_compile_fullgraph_matches_eager():
    """One inductor graph holding both custom ops, dynamic in M, equals eager bit for bit."""
    x, w, s = _problem(BF16, m=9, n=40, k=64)
    tw, ts = to_torch(w), to_torch(s)
    layer = qt.WoqLinear.from_linear(torch.nn.Linear(40, 24), dtype=torch.bfloat16)

    def f(x):
        return layer(torch.relu(qt.weight_int8pack_mm(x * 2, tw, ts)))

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    for m in (9, 3):
        tx = to_torch(x[:m])
        assert torch.equal(compiled(tx), f(tx))
    assert len(graphs) == 1
    targets = {node.target for node in graphs[0].graph.nodes}
    assert {torch.ops.qkern.weight_int8pack_mm, torch.ops.qkern.woq_linear} <= targets


def test_export_holds_the_ops():
    x, w, s = _problem(np.dtype(np.float32), n=40)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", to_torch(w))
            self.register_buffer("s", to_torch(s))
            self.out = qt.WoqLinear.from_linear(torch.nn.Linear(40, 8))

        def forward(self, x):
            return self.out(qt.weight_int8pack_mm(x, self.w, self.s))

    model, tx = Model(), to_torch(x)
    program = torch.export.export(model, (tx,))
    targets = {node.target for node in program.graph.nodes}
    assert {torch.ops.qkern.weight_int8pack_mm.default,
            torch.ops.qkern.woq_linear.default} <= targets
    assert torch.equal(program.module()(tx), model(tx))


# ---- quantize_per_channel ------------------------------------------------------


@given(n=st.integers(1, 12), k=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       magnitude=st.integers(-20, 8), zero_row=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(n=2, k=3, dtype=np.dtype(np.float16), magnitude=-20, zero_row=True, seed=0)
def test_quantize_per_channel(n, k, dtype, magnitude, zero_row, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) * 2.0**magnitude
    if zero_row:
        w[0] = 0.0
    q, s = qt.quantize_per_channel(torch.from_numpy(w).float(), TORCH_DTYPES[dtype])
    assert q.dtype == torch.int8 and q.shape == (n, k) and s.dtype == TORCH_DTYPES[dtype]
    w = w.astype(np.float32).astype(np.float64)
    q, s = q.numpy().astype(np.float64), to_numpy(s).astype(np.float64)
    exact = np.abs(w).max(axis=1) / 127
    assert (np.abs(q) <= 127).all()
    # The scale is max|w| / 127 rounded up to the dtype: no smaller value is >= it.
    assert (s >= exact).all()
    below = np.nextafter(s.astype(dtype), np.array(-np.inf, dtype)).astype(np.float64)
    assert (below[exact > 0] < exact[exact > 0]).all()
    assert (np.abs(w - q * s[:, None]) <= s[:, None] / 2).all()
    if zero_row:
        assert s[0] == 0 and (q[0] == 0).all()


def test_quantize_per_channel_errors():
    with pytest.raises(ValueError, match="inf or NaN"):
        qt.quantize_per_channel(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="overflows torch.float16"):
        qt.quantize_per_channel(torch.tensor([[1e7, 1.0]]), torch.float16)
    with pytest.raises(TypeError, match="dtype: expected torch.float32"):
        qt.quantize_per_channel(torch.ones(2, 2), torch.float64)
    with pytest.raises(ValueError, match="weight: expected a floating"):
        qt.quantize_per_channel(torch.ones(2, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="weight: expected a floating"):
        qt.quantize_per_channel(torch.ones(4))


# ---- WoqLinear -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_woqlinear_matches_qkern_layer_zero_copy(dtype, monkeypatch):
    x, w, s = _problem(dtype, m=7, n=24, k=48)
    b = np.random.default_rng(1).standard_normal(24).astype(dtype)
    module = qt.WoqLinear(to_torch(w), to_torch(s), to_torch(b))
    expect = qkern.WoqLinear(w, s, b)(x)
    seen = []
    real = qkern.WoqLinear.__call__

    def spy(self, x_np, **kw):
        seen.append((x_np.ctypes.data, kw["out"].ctypes.data))
        return real(self, x_np, **kw)

    monkeypatch.setattr(qkern.WoqLinear, "__call__", spy)
    tx = to_torch(x)
    y = module(tx)
    assert seen == [(tx.data_ptr(), y.data_ptr())]
    assert y.dtype == TORCH_DTYPES[dtype]
    assert np.array_equal(_bits(y), expect.view(np.uint8))
    assert (module.in_features, module.out_features, module.dtype) == (48, 24, TORCH_DTYPES[dtype])
    assert repr(module) == (f"WoqLinear(in_features=48, out_features=24, bias=True, "
                            f"dtype={TORCH_DTYPES[dtype]})")


def test_woqlinear_holds_one_packed_copy_and_no_tensors():
    linear = torch.nn.Linear(96, 80)
    module = qt.WoqLinear.from_linear(linear)
    assert list(module.parameters()) == [] and list(module.buffers()) == []
    held = [v for v in vars(module._layer).values()
            if isinstance(v, np.ndarray) and v.dtype == np.int8]
    assert len(held) == 1 and module.nbytes == module._layer.nbytes
    assert module.to(torch.float16).dtype == torch.float32  # nothing to convert


def test_woqlinear_bad_arguments():
    with pytest.raises(TypeError, match="weight: expected a torch.Tensor"):
        qt.WoqLinear(np.ones((2, 3), np.int8), torch.ones(2))
    with pytest.raises(TypeError, match="w: expected dtype int8"):
        qt.WoqLinear(torch.ones(2, 3), torch.ones(2))
    with pytest.raises(ValueError, match=r"scales: expected shape \(2,\)"):
        qt.WoqLinear(torch.ones(2, 3, dtype=torch.int8), torch.ones(3))
    with pytest.raises(TypeError, match="bias: expected dtype bfloat16"):
        qt.WoqLinear(torch.ones(2, 3, dtype=torch.int8), torch.ones(2, dtype=torch.bfloat16),
                     torch.ones(2))
    module = qt.WoqLinear(torch.ones(2, 3, dtype=torch.int8), torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x: expected dtype torch.bfloat16 .the dtype of the "
                                        "scales., got torch.float32"):
        module(torch.ones(3))
    with pytest.raises(ValueError, match="x: expected last dimension K=3"):
        module(torch.ones(4, dtype=torch.bfloat16))


def _mlp(seed, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96, bias=bias), torch.nn.ReLU(),
                               torch.nn.Linear(96, 80, bias=bias), torch.nn.ReLU(),
                               torch.nn.Linear(80, 48, bias=bias))


def test_torch_flush_denormal_changes_no_bit():
    """The issue's case: after torch.set_flush_denormal(True) in the calling
    thread, one and two threads gave different bits for subnormal
    activations (the caller's columns flushed, the OpenMP worker's not).
    Every thread now runs under IEEE 754 defaults (more in test_fpenv.py)."""
    w = np.ones((2048, 2048), np.int8)
    s = np.ones(2048, np.float32)
    layer = qkern.WoqLinear(w, s)
    x = np.full((1, 2048), 1e-42, np.float32)
    want = layer(x, num_threads=2).view(np.uint32)  # starts the OpenMP worker too
    assert (want != 0).all()  # 2048 * 1e-42, kept by gradual underflow
    if not torch.set_flush_denormal(True):
        pytest.skip("torch cannot set flush-to-zero on this CPU")
    threads = torch.get_num_threads()
    try:
        assert (torch.tensor([1e-42]) * 1 == 0).all()  # torch's flush is on
        got = [layer(x, num_threads=t).view(np.uint32) for t in (1, 2)]
        torch.set_num_threads(2)
        got.append(to_numpy(qt.weight_int8pack_mm(torch.from_numpy(x), torch.from_numpy(w),
                                                  torch.from_numpy(s))).view(np.uint32))
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    for bits in got:
        assert np.array_equal(bits, want)


def test_state_dict_round_trip():
    model = qt.swap_linears(_mlp(0), dtype=torch.bfloat16)
    x = torch.randn(5, 64).to(torch.bfloat16)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    state = torch.load(io.BytesIO(buf.getvalue()))
    assert sorted(state) == [f"{i}.{name}" for i in (0, 2, 4)
                             for name in ("bias", "scales", "weight")]
    q, s = qt.quantize_per_channel(_mlp(0)[0].weight, torch.bfloat16)
    assert torch.equal(state["0.weight"], q) and torch.equal(state["0.scales"], s)
    other = qt.swap_linears(_mlp(1), dtype=torch.bfloat16)
    assert not torch.equal(other(x), model(x))
    other.load_state_dict(state)
    assert torch.equal(other(x), model(x))
    # scales and bias are converted to the layer's dtype, as Tensor.copy_ would.
    state32 = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    other.load_state_dict(state32)
    assert torch.equal(other(x), model(x))


def test_load_state_dict_errors_leave_the_layer_alone():
    module = qt.WoqLinear.from_linear(torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    before = module(x)
    state = module.state_dict()
    other = qt.WoqLinear.from_linear(torch.nn.Linear(8, 4, bias=False))
    with pytest.raises(RuntimeError, match='Unexpected key.*"bias"'):
        other.load_state_dict(state)
    with pytest.raises(RuntimeError, match='Missing key.*"bias"'):
        module.load_state_dict({k: v for k, v in state.items() if k != "bias"})
    result = module.load_state_dict({"weight": state["weight"], "extra": x}, strict=False)
    assert result.missing_keys == ["scales", "bias"] and result.unexpected_keys == ["extra"]
    with pytest.raises(RuntimeError, match=r"size mismatch for weight.*\(4, 9\).*\(4, 8\)"):
        module.load_state_dict({**state, "weight": torch.ones(4, 9, dtype=torch.int8)})
    with pytest.raises(RuntimeError, match="dtype mismatch for weight: expected torch.int8"):
        module.load_state_dict({**state, "weight": torch.ones(4, 8)})
    assert torch.equal(module(x), before)


def test_load_state_dict_pre_hooks_run():
    module = qt.WoqLinear.from_linear(torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    old = {"w" if k == "weight" else k: v for k, v in module.state_dict().items()}

    def rename(module, state_dict, prefix, *args):
        state_dict[prefix + "weight"] = state_dict.pop(prefix + "w")

    other = qt.WoqLinear.from_linear(torch.nn.Linear(8, 4))
    other.register_load_state_dict_pre_hook(rename)
    other.load_state_dict(old)
    assert torch.equal(other(x), module(x))


def test_copies_have_their_own_packed_layer():
    model = qt.swap_linears(_mlp(0))
    x = torch.randn(4, 64)
    expect = model(x)
    clone = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    restored = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    unpickled = pickle.loads(pickle.dumps(model))
    keys = {m._key for mod in (model, clone, restored, unpickled) for m in mod
            if isinstance(m, qt.WoqLinear)}
    assert len(keys) == 12
    stale = model[0]._key
    del model
    gc.collect()
    for copy_ in (clone, restored, unpickled):
        assert torch.equal(copy_(x), expect)
    with pytest.raises(RuntimeError, match=f"no live qkern.torch.WoqLinear with key '{stale}'"):
        torch.ops.qkern.woq_linear(x, stale)


def test_swap_linears_replaces_exactly_nn_linear():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
            self.table = torch.nn.ModuleDict({"proj": torch.nn.Linear(8, 4, bias=False)})
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            x = self.heads[1](self.heads[0](x))
            return self.table["proj"](self.attn(x, x, x, need_weights=False)[0])

    block = Block()
    x = torch.randn(2, 3, 8)
    expect = block(x)
    assert qt.swap_linears(block) is block
    kinds = {name: type(m).__name__ for name, m in block.named_modules()}
    assert kinds["heads.0"] == kinds["heads.1"] == kinds["table.proj"] == "WoqLinear"
    # MultiheadAttention reads its out_proj's weight itself: a subclass, left as it is.
    assert kinds["attn.out_proj"] == "NonDynamicallyQuantizableLinear"
    assert block(x).shape == expect.shape
    single = qt.swap_linears(torch.nn.Linear(8, 2), dtype=torch.float16)
    assert isinstance(single, qt.WoqLinear) and single.dtype == torch.float16


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
def test_swapped_mlp_within_quantization_bound(dtype):
    """The swapped MLP against the float model evaluated exactly (float64).

    Per linear layer, with h the exact activations of the float model, ĥ the
    swapped model's, W the float weight, Ŵ = q * s the quantized one
    (|W - Ŵ| <= s / 2 elementwise, checked), b and b̂ the biases:

        ŷ - (W h + b) = Ŵ (ĥ - h) + (Ŵ - W) h + (b̂ - b) + (ŷ - (Ŵ ĥ + b̂))

    so |ŷ - y| <= |Ŵ| D + s/2 * ||h||_1 + |b̂ - b| + E, where D bounds |ĥ - h|
    from the layer before (0 at the input, which both see in ``dtype``) and E
    is the kernel's own error on its actual inputs (reference.woq_bound).
    ReLU is 1-Lipschitz, so D carries over unchanged.

    That bound is worst case over the signs of the weight errors, so it is
    loose; against the quantized model evaluated exactly (h_q, with Ŵ and b̂)
    only the kernel errors remain, |ĥ - h_q| <= |Ŵ| D_q + E, a tight check.
    """
    model = _mlp(3)
    torch_dtype = TORCH_DTYPES[dtype]
    swapped = qt.swap_linears(copy.deepcopy(model), dtype=torch_dtype)
    x = torch.randn(7, 64).to(torch_dtype)
    h = h_q = to_numpy(x).astype(np.float64)
    h_hat = x
    bound = bound_q = np.zeros_like(h)
    for layer, q_layer in zip(model, swapped):
        if isinstance(layer, torch.nn.ReLU):
            h, h_q, h_hat = np.maximum(h, 0), np.maximum(h_q, 0), q_layer(h_hat)
            continue
        state = q_layer.state_dict()
        q, s, b_hat = (to_numpy(state[k]) for k in ("weight", "scales", "bias"))
        s64, b_hat64 = s.astype(np.float64), b_hat.astype(np.float64)
        w = layer.weight.detach().double().numpy()
        b = layer.bias.detach().double().numpy()
        w_hat = q.astype(np.float64) * s64[:, None]
        assert (np.abs(w - w_hat) <= s64[:, None] / 2).all()
        kernel = woq_bound(to_numpy(h_hat), q, s, b_hat, dtype, daz=dtype == BF16)
        quant = np.abs(h).sum(axis=1, keepdims=True) * (s64 / 2)
        bound = bound @ np.abs(w_hat).T + quant + np.abs(b_hat64 - b) + kernel
        bound_q = bound_q @ np.abs(w_hat).T + kernel
        h, h_q, h_hat = h @ w.T + b, h_q @ w_hat.T + b_hat64, q_layer(h_hat)
    y = to_numpy(h_hat).astype(np.float64)
    err, err_q = np.abs(y - h), np.abs(y - h_q)
    assert (err <= bound).all(), f"worst excess {(err - bound).max():.3g}"
    assert (err_q <= bound_q).all(), f"worst excess {(err_q - bound_q).max():.3g}"
    if U_OUT[dtype] == 0:
        # In float32 the error from the float model is the weight quantization's.
        assert err.max() > bound_q.max()
