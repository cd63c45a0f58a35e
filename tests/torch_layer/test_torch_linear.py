"""qkern.torch.WoqLinear (zero copy, one packed copy, errors, state_dict, copies),
swap_linears on a small MLP against the float model under a derived bound, and
swap_linears on shared linears, transformer encoders and linears it cannot convert
(all or nothing); layer keys that another process's program does not find.
"""

import copy
import gc
import io
import pickle

import numpy as np
import pytest

import qkern
from conftest import woq_bound_traits
from process_support import run_python
from qkern.packing import PackedWeight
from reference import BF16, DTYPES, U_OUT, woq_bound

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import DTYPE_IDS, TORCH_DTYPES, bits, to_numpy, to_torch, woq_problem  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_woqlinear_matches_qkern_layer_zero_copy(dtype, monkeypatch):
    x, w, s = woq_problem(dtype, m=7, n=24, k=48)
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
    assert np.array_equal(bits(y), expect.view(np.uint8))
    assert (module.in_features, module.out_features, module.dtype) == (48, 24, TORCH_DTYPES[dtype])
    assert repr(module) == (f"WoqLinear(in_features=48, out_features=24, bias=True, "
                            f"dtype={TORCH_DTYPES[dtype]})")


def test_woqlinear_holds_one_packed_copy_and_no_tensors():
    linear = torch.nn.Linear(96, 80)
    module = qt.WoqLinear.from_linear(linear)
    assert list(module.parameters()) == [] and list(module.buffers()) == []
    held = list(vars(module._layer).values())
    assert [v for v in held if isinstance(v, PackedWeight)] == [module._layer.packed_weight]
    assert not [v for v in held if isinstance(v, np.ndarray) and v.dtype == np.int8]
    assert module.nbytes == module._layer.nbytes
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
        kernel = woq_bound(to_numpy(h_hat), q, s, b_hat, dtype, **woq_bound_traits(dtype))
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


@pytest.mark.parametrize("n_bits", [8, 4])
def test_swap_linears_keeps_a_shared_linear_shared(n_bits):
    """A Linear in two places of one parent (``named_children`` lists it once) and
    one held by two parents: every place gets the one new layer of that Linear."""
    torch.manual_seed(4)
    twice = torch.nn.Linear(32, 32)
    shared = torch.nn.Linear(32, 32)
    model = torch.nn.Sequential(twice, torch.nn.ReLU(), twice, torch.nn.Sequential(shared),
                                torch.nn.Sequential(shared))
    expect = model(torch.ones(1, 32))
    assert qt.swap_linears(model, bits=n_bits, group_size=32) is model
    kind = qt.WoqLinear if n_bits == 8 else qt.Int4Linear
    assert [type(m) for m in (model[0], model[2], model[3][0], model[4][0])] == [kind] * 4
    assert model[0] is model[2] and model[3][0] is model[4][0] and model[0] is not model[3][0]
    assert len(list(model.modules())) == 6  # the model, ReLU, two layers, two Sequentials
    got = model(torch.ones(1, 32))
    assert (got - expect).abs().max() < 0.25 * expect.abs().max()


class _Encoder(torch.nn.Module):
    """A batch-first transformer encoder and a linear head."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(16, 8)

    def forward(self, x, padding=None):
        return self.head(self.encoder(x, src_key_padding_mask=padding))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_swapped_transformer_encoder_runs_in_eval_without_grad():
    """In eval without grad, nn.TransformerEncoderLayer's fast path reads linear1.weight
    and linear2.weight itself (and nn.TransformerEncoder its first layer's), so those
    stay nn.Linear: the encoder runs as the float one, fast path and nested tensors
    included, and the head is swapped."""
    torch.manual_seed(5)
    model = _Encoder().eval()
    swapped = qt.swap_linears(copy.deepcopy(model))
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False, False, False, True, True], [False] * 5])
    for context in (torch.no_grad, torch.inference_mode):
        for mask in (None, padding):
            with context():
                hidden = model.encoder(x, src_key_padding_mask=mask)
                assert torch.equal(swapped(x, mask), swapped.head(hidden))
    assert type(swapped.head) is qt.WoqLinear
    for layer in swapped.encoder.layers:
        assert type(layer.linear1) is type(layer.linear2) is torch.nn.Linear
    layer = qt.swap_linears(copy.deepcopy(model.encoder.layers[0]))
    with torch.no_grad():
        assert torch.equal(layer(x), model.encoder.layers[0](x))


def _nan_linear():
    linear = torch.nn.Linear(8, 8)
    with torch.no_grad():
        linear.weight[0, 0] = float("nan")
    return linear


@pytest.mark.parametrize("late, exc, match", [
    (lambda: torch.nn.Linear(8, 8).double(), TypeError, "dtype: expected torch.float32"),
    (_nan_linear, ValueError, "inf or NaN"),
    (lambda: torch.nn.Linear(8, 8, device="meta"), ValueError,
     "weight: expected a CPU tensor, got device meta"),
], ids=["float64", "nan", "meta"])
def test_swap_linears_fails_without_changing_the_model(late, exc, match):
    """A Linear that cannot be converted, after one that can: nothing is replaced."""
    first, nested, failing = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), late()
    model = torch.nn.Sequential(first, torch.nn.Sequential(nested), failing)
    with pytest.raises(exc, match=match):
        qt.swap_linears(model)
    assert model[0] is first and model[1][0] is nested and model[2] is failing


@pytest.mark.parametrize("n_bits", [8, 4])
def test_a_meta_linear_is_refused_alike_at_8_and_4_bits(n_bits):
    """The int8 path checks the device before quantizing, as the int4 path does."""
    with pytest.raises(ValueError, match="weight: expected a CPU tensor, got device meta"):
        qt.swap_linears(torch.nn.Linear(64, 8, device="meta"), bits=n_bits, group_size=32)


EXPORT = """
import torch
import qkern.torch as qt

torch.manual_seed(SEED)
x = torch.ones(1, 64)
for bits in (8, 4):
    model = qt.swap_linears(torch.nn.Sequential(torch.nn.Linear(64, 32)), bits=bits,
                            group_size=32)
    path = f"{DIR}/int{bits}.pt2"
    if SAVE:
        torch.export.save(torch.export.export(model, (x,)), path)
        continue
    try:
        torch.export.load(path).module()(x)
    except RuntimeError as exc:
        print(exc)
    else:
        print("ran with a layer of this process")
"""


def test_an_exported_program_finds_no_layer_of_another_process(tmp_path):
    """Keys are unique across processes: a program exported in one process and loaded
    in another, which has its own layers of the same architecture, names none of them."""
    for seed, save in ((0, True), (1, False)):
        proc = run_python(f"SEED, DIR, SAVE = {seed}, {str(tmp_path)!r}, {save}\n" + EXPORT)
        assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    for line, module in zip(lines, ("WoqLinear", "Int4Linear")):
        assert f"no live qkern.torch.{module} with key" in line, line
