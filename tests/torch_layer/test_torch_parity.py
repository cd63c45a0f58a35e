"""Parity with torch._weight_int8pack_mm (when PyTorch is installed), of both
``qkern.weight_int8pack_mm`` (NumPy) and the custom op ``qkern.torch.weight_int8pack_mm``.

PyTorch 2.13's CPU op has no K tail and uses aligned loads, so K % 16 == 0
here and every tensor handed to it is a fresh (aligned) torch allocation.
Both results are compared with the exact one under the bound of
tests/reference.py; the two may differ from each other by at most the sum
of their bounds. The custom op runs the same kernel as the NumPy call (the
kernel depends on dtype and M only), so their results are the same bits.
"""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import qkern
from reference import BF16, assert_woq_close, woq_bound

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch  # noqa: E402  (needs torch)
from torch_support import TORCH_DTYPES, to_numpy, to_torch  # noqa: E402


@given(m=st.integers(1, 40), n=st.integers(1, 90), k16=st.integers(1, 24),
       dtype=st.sampled_from(list(TORCH_DTYPES)), seed=st.integers(0, 2**32 - 1))
@example(m=1, n=1, k16=1, dtype=BF16, seed=0)
@example(m=33, n=4097 // 16, k16=64, dtype=BF16, seed=1)
def test_parity_with_torch(m, n, k16, dtype, seed):
    k = 16 * k16
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.001, 0.02, n).astype(dtype)
    ours = qkern.weight_int8pack_mm(x, w, s)
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    theirs = to_numpy(torch._weight_int8pack_mm(tx, tw, ts))
    op = qkern.torch.weight_int8pack_mm(tx, tw, ts)
    assert op.dtype == TORCH_DTYPES[dtype] and op.shape == (m, n)
    assert np.array_equal(to_numpy(op).view(np.uint8), ours.view(np.uint8))
    kern = qkern.dispatch.choose_kernel(dtype, m, unpacked_ok=True, n=n)
    ours_terms = {"daz": kern.flushes_subnormals, "planes": kern.planes(dtype)}
    assert_woq_close(ours, x, w, s, **ours_terms)
    assert_woq_close(theirs, x, w, s, daz=dtype == BF16)
    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    bound = (woq_bound(x, w, s, None, dtype, **ours_terms)
             + woq_bound(x, w, s, None, dtype, dtype == BF16))
    assert (diff <= bound).all()


def test_bench_leaves_torch_out_where_its_kernel_would_crash(monkeypatch):
    """benchmarks/peers.py times torch._weight_int8pack_mm only where K % 16 == 0
    (the K the op survives), and every qkern peer on every K."""
    from bench_support import load_benchmark

    peers = load_benchmark("peers")
    monkeypatch.setattr(peers, "copies_for_cold", lambda nbytes: 2)
    rng = np.random.default_rng(0)
    for k, with_torch in ((48, True), (47, False)):
        names = peers._Problem(rng, 40, k, 4, torch).calls(3, 1, False)
        assert ("torch._weight_int8pack_mm" in names) == with_torch
        assert {"qkern bfloat16", f"torch.mm {peers.DENSE_DTYPE} dense"} <= set(names)
