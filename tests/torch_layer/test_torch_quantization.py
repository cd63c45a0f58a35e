"""qkern.torch.quantize_per_channel: the scale is max |w| / 127 rounded up to its dtype,
|q| <= 127 and every weight within half a scale; errors.
"""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reference import DTYPES

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import TORCH_DTYPES, to_numpy  # noqa: E402


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
