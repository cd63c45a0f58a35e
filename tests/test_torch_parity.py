"""Parity with torch._weight_int8pack_mm (when PyTorch is installed).

PyTorch 2.13's CPU op has no K tail and uses aligned loads, so K % 16 == 0
here and every tensor handed to it is a fresh (aligned) clone.  Both results
are compared with the exact one under the bound of tests/reference.py; the
two may differ from each other by at most the sum of their bounds.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import qkern
from reference import BF16, assert_woq_close, woq_bound

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                BF16: torch.bfloat16}


def _to_torch(a):
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).clone()
    return torch.from_numpy(a).clone()


def _from_torch(t, dtype):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy().astype(dtype)


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
    theirs = _from_torch(torch._weight_int8pack_mm(_to_torch(x), _to_torch(w), _to_torch(s)), dtype)
    kern = qkern.dispatch.choose_kernel(dtype, m)
    ours_terms = {"daz": kern.name.startswith("bf16"), "planes": kern.planes(dtype)}
    assert_woq_close(ours, x, w, s, **ours_terms)
    assert_woq_close(theirs, x, w, s, daz=dtype == BF16)
    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    bound = (woq_bound(x, w, s, None, dtype, **ours_terms)
             + woq_bound(x, w, s, None, dtype, dtype == BF16))
    assert (diff <= bound).all()
