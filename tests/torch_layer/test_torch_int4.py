"""int4 in the torch layer: parity with torch._weight_int4pack_mm_for_cpu
through PyTorch's own packing (int4_from_torch_packed, its shape check and
the table it does not keep), the op
qkern::weight_int4pack_mm, qkern.torch.Int4Linear (state_dict, copies,
torch.compile) and swap_linears(bits=4).

Parity bound: qkern's result is within tests/reference.int4_bound of the
exact y*; PyTorch's, whatever its order of sums and whether it rounds the
dequantized weight to x's dtype first, within
(gamma_{K+3} + u_x) * sum_k |x_k W_nk| + u_x |y*| (+ half a subnormal), so
the two differ by at most the sum.
"""

import copy
import gc
import pickle
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qkern
from conftest import int4_bound_traits
from reference import (
    BF16,
    DTYPES,
    HALF_MIN_SUBNORMAL,
    U32,
    U_OUT,
    assert_int4_close,
    int4_bound,
    int4_dequantize,
    int4_reference,
)

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import DTYPE_IDS, TORCH_DTYPES, to_numpy, to_torch  # noqa: E402


def _torch_bound(x, q, sz, group_size, dtype):
    k = np.asarray(q).shape[1]
    gamma = (k + 3) * U32 / (1 - (k + 3) * U32)
    u = U_OUT[np.dtype(dtype)]
    big_s = np.abs(x.astype(np.float64)) @ np.abs(int4_dequantize(q, sz, group_size)).T
    exact = np.abs(int4_reference(x, q, sz, group_size))
    return (gamma + u) * big_s + u * exact + HALF_MIN_SUBNORMAL[np.dtype(dtype)]


def _problem(rng, m, n, k, group_size, dtype):
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    groups = k // group_size
    sz = np.stack([rng.uniform(0.01, 0.1, (groups, n)), rng.uniform(-0.1, 0.1, (groups, n))],
                  axis=-1).astype(dtype)
    x = rng.standard_normal((m, k)).astype(dtype)
    return x, q, sz


@given(m=st.integers(1, 12), n16=st.integers(1, 6), groups=st.integers(1, 3),
       group_size=st.sampled_from([32, 64, 128]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_parity_with_torch_through_its_own_packing(m, n16, groups, group_size, dtype, seed):
    n, k = 16 * n16, groups * group_size  # PyTorch packs N a multiple of 16 only
    x, q, sz = _problem(np.random.default_rng(seed), m, n, k, group_size, dtype)
    torch_packed = torch._convert_weight_to_int4pack_for_cpu(
        torch.from_numpy(q.astype(np.int32)), 1)
    theirs = to_numpy(torch._weight_int4pack_mm_for_cpu(to_torch(x), torch_packed, group_size,
                                                         to_torch(sz)))
    converted = qt.int4_from_torch_packed(torch_packed, n, k)
    assert np.array_equal(converted, q)
    layer = qt.Int4Linear.from_torch_int4pack(torch_packed, group_size, to_torch(sz),
                                              in_features=k)
    ours = to_numpy(layer(to_torch(x)))
    assert_int4_close(ours, x, q, sz, group_size, **int4_bound_traits(x, len(q)))
    op = to_numpy(qt.weight_int4pack_mm(to_torch(x), torch.from_numpy(qkern.pack_int4(q)),
                                        group_size, to_torch(sz)))
    assert np.array_equal(op.view(np.uint8), ours.view(np.uint8))
    tol = (int4_bound(x, q, sz, group_size, None, dtype, **int4_bound_traits(x, len(q)))
           + _torch_bound(x, q, sz, group_size, dtype))
    err = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    assert (err <= tol).all(), float((err - tol).max())


def test_conversion_refuses_a_wrong_shape_and_a_packing_that_is_no_reordering(monkeypatch):
    q = torch.randint(0, 16, (32, 64), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    with pytest.raises(ValueError, match=r"packed: shape \(32, 32\) is not \(32, 64\)"):
        qt.int4_from_torch_packed(packed, 32, 128)
    with pytest.raises(TypeError, match="uint8 torch.Tensor"):
        qt.int4_from_torch_packed(packed.to(torch.int32), 32, 64)
    # a packing that loses values (as one that padded or merged would) is refused
    monkeypatch.setattr(torch, "_convert_weight_to_int4pack_for_cpu",
                        lambda w, tiles: torch.zeros(w.shape[0], w.shape[1] // 2,
                                                     dtype=torch.uint8))
    with pytest.raises(ValueError, match="not a reordering"):
        qt.int4_from_torch_packed(packed, 32, 64)


def test_conversion_checks_the_packed_shape():
    """PyTorch packs an (N, K) weight into an (N, K / 2) tensor: n and k swapped, or
    the bytes in another shape, are refused (their byte count is the same), and so
    is an odd k."""
    q = torch.randint(0, 16, (32, 64), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    assert tuple(packed.shape) == (32, 32)
    for bad in ((64, 32), (16, 128), (32, 65)):
        with pytest.raises(ValueError, match=r"packed: shape \(32, 32\) is not"):
            qt.int4_from_torch_packed(packed, *bad)
    with pytest.raises(ValueError, match=r"packed: shape \(1024,\) is not \(32, 32\)"):
        qt.int4_from_torch_packed(packed.reshape(-1), 32, 64)


def test_conversion_keeps_no_position_table():
    """The table of where PyTorch puts each value (4 bytes a weight) goes when the
    conversion returns: nothing of size N * K stays behind."""
    from qkern.torch import _int4

    table = weakref.ref(_int4._torch_int4_positions(64, 128))
    gc.collect()
    assert table() is None


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_int4_linear_module_runs_the_numpy_layer(dtype):
    rng = np.random.default_rng(3)
    linear = torch.nn.Linear(128, 40).to(TORCH_DTYPES[dtype])
    layer = qt.Int4Linear.from_linear(linear, group_size=64)
    assert (layer.in_features, layer.out_features, layer.group_size) == (128, 40, 64)
    assert layer.dtype == TORCH_DTYPES[dtype] and not list(layer.parameters())
    q, sz = qkern.quantize_int4(to_numpy(linear.weight.detach()), 64)
    x = rng.standard_normal((2, 3, 128)).astype(dtype)
    y = to_numpy(layer(to_torch(x)))
    b = to_numpy(linear.bias.detach())
    assert_int4_close(y.reshape(6, 40), x.reshape(6, 128), q, sz, 64, b,
                      **int4_bound_traits(x.reshape(6, 128), len(q)))
    assert layer.nbytes == layer._layer.nbytes
    with pytest.raises(TypeError, match="x: expected dtype"):
        layer(torch.zeros(2, 128, dtype=torch.float64))


def test_state_dict_round_trip_copies_and_compile():
    torch.manual_seed(0)
    layer = qt.Int4Linear.from_linear(torch.nn.Linear(256, 70), group_size=128)
    state = layer.state_dict()
    assert sorted(state) == ["bias", "scales_and_zeros", "w_packed"]
    assert state["w_packed"].dtype == torch.uint8 and tuple(state["w_packed"].shape) == (3, 256, 16)
    other = qt.Int4Linear.from_linear(torch.nn.Linear(256, 70), group_size=128)
    x = torch.randn(4, 256)
    other.load_state_dict(state)
    assert torch.equal(other(x), layer(x))
    bad = dict(state, w_packed=state["w_packed"][:2])
    with pytest.raises(RuntimeError, match="size mismatch for w_packed"):
        other.load_state_dict(bad)
    assert torch.equal(other(x), layer(x))  # left as it was
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone._key != layer._key and torch.equal(clone(x), layer(x))
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(x), layer(x))
    fn = torch.compile(lambda a, w, s: qt.weight_int4pack_mm(a, w, 128, s), fullgraph=True)
    w = torch.from_numpy(layer._layer.packed_weight.copy())
    s = torch.from_numpy(layer._layer.scales_and_zeros.copy())
    assert torch.equal(fn(x, w, s), qt.weight_int4pack_mm(x, w, 128, s))


def test_op_errors_name_the_argument():
    q, sz = qkern.quantize_int4(np.ones((8, 64), np.float32), 32)
    w, s, x = torch.from_numpy(qkern.pack_int4(q)), torch.from_numpy(sz), torch.ones(2, 64)
    with pytest.raises(TypeError, match="w_packed: expected dtype uint8"):
        qt.weight_int4pack_mm(x, w.to(torch.int8), 32, s)
    with pytest.raises(ValueError, match="group_size: expected one of"):
        qt.weight_int4pack_mm(x, w, 16, s)
    with pytest.raises(TypeError, match="scales_and_zeros: expected dtype"):
        qt.weight_int4pack_mm(x, w, 32, s.half())
    with pytest.raises(ValueError, match="scales_and_zeros: expected shape"):
        qt.weight_int4pack_mm(x, w, 32, s[:1])
    with pytest.raises(ValueError, match="x: expected last dimension K=64"):
        qt.weight_int4pack_mm(torch.ones(2, 32), w, 32, s)


def test_swap_linears_bits_4():
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    x = torch.randn(3, 64)
    expect = mlp(x)
    swapped = qt.swap_linears(copy.deepcopy(mlp), bits=4, group_size=32)
    assert [type(m).__name__ for m in swapped] == ["Int4Linear", "ReLU", "Int4Linear"]
    got = swapped(x)
    # 4 bits per weight: a coarse check of the whole model (each layer is
    # checked against its exact result above)
    assert (got - expect).abs().max() < 0.25 * expect.abs().max()
    with pytest.raises(ValueError, match="0: in_features=64 is not a multiple of group_size=128"):
        qt.swap_linears(copy.deepcopy(mlp), bits=4, group_size=128)
    assert type(mlp[0]) is torch.nn.Linear  # nothing replaced before the error
    with pytest.raises(ValueError, match="bits: expected 4 or 8"):
        qt.swap_linears(mlp, bits=2)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
def test_int4_linear_bias_and_batches(dtype):
    rng = np.random.default_rng(9)
    x, q, sz = _problem(rng, 6, 48, 256, 128, dtype)
    b = rng.standard_normal(48).astype(dtype)
    layer = qt.Int4Linear(torch.from_numpy(qkern.pack_int4(q)), 128, to_torch(sz), to_torch(b))
    y = to_numpy(layer(to_torch(x.reshape(2, 3, 256)))).reshape(6, 48)
    assert_int4_close(y, x, q, sz, 128, b, **int4_bound_traits(x, len(q)))
