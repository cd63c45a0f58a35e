"""qkern.torch's tensors into qkern and back: qkern reads the tensors' own memory and
writes the tensor it returns (no copies), rows any distance apart, a last dimension
that is not unit-stride, batch dimensions, K tails and empty shapes.
"""

import numpy as np
import pytest

import qkern
from reference import BF16, DTYPES, assert_woq_close

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import DTYPE_IDS, bits, to_torch, woq_problem  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_op_is_zero_copy(dtype, monkeypatch):
    """qkern reads the tensors' own memory and writes the tensor that is returned."""
    x, w, s = woq_problem(dtype, m=6, k=64)
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
        assert y.is_contiguous() and np.array_equal(bits(y), expect.view(np.uint8)), name


def test_op_any_strides_batch_dims_k_tails_and_empty():
    x, w, s = woq_problem(BF16, m=6, n=10, k=33)  # K % 16 != 0: no problem for qkern
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    expect = qkern.weight_int8pack_mm(x, w, s)
    assert_woq_close(expect, x, w, s, daz=True)
    # x with a non-unit last stride (qkern copies it), and with batch dimensions.
    x_t = to_torch(np.ascontiguousarray(x.T)).t()
    assert not x_t.is_contiguous()
    assert np.array_equal(bits(qt.weight_int8pack_mm(x_t, tw, ts)), expect.view(np.uint8))
    y3 = qt.weight_int8pack_mm(tx.reshape(2, 3, 33), tw, ts)
    assert y3.shape == (2, 3, 10)
    assert np.array_equal(bits(y3.reshape(6, 10)), expect.view(np.uint8))
    assert qt.weight_int8pack_mm(tx[:0], tw, ts).shape == (0, 10)
    assert qt.weight_int8pack_mm(tx, tw[:0], ts[:0]).shape == (6, 0)
    y0 = qt.weight_int8pack_mm(tx[:, :0], tw[:, :0].contiguous(), ts)
    assert y0.shape == (6, 10) and (y0 == 0).all()
