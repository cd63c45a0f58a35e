"""Tensor <-> NumPy copies for the PyTorch tests, independent of qkern.torch (under test),
and the WoQ problems that the tests of its GEMM share.

Every tensor made here is a fresh torch allocation: torch._weight_int8pack_mm
(2.13) uses aligned loads and crashes on NumPy-backed memory.
"""

import numpy as np
import torch

from reference import BF16, DTYPES

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                BF16: torch.bfloat16}
DTYPE_IDS = [d.name for d in DTYPES]


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch-allocated copy of ``a`` (float dtypes through float32, which is exact)."""
    if a.dtype in TORCH_DTYPES:
        return torch.from_numpy(a.astype(np.float32)).to(TORCH_DTYPES[a.dtype]).clone()
    return torch.from_numpy(a).clone()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of ``t`` in the matching dtype (float dtypes through float32)."""
    for np_dtype, torch_dtype in TORCH_DTYPES.items():
        if t.dtype == torch_dtype:
            return t.detach().float().numpy().astype(np_dtype)
    return t.detach().numpy().copy()


def woq_problem(dtype, m=5, n=24, k=48, seed=0):
    """(x, w, scales) as NumPy arrays in ``dtype``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.001, 0.02, n).astype(dtype)
    return x, w, s


def bits(t: torch.Tensor) -> np.ndarray:
    """The bytes of a NumPy copy of ``t``, for comparisons bit for bit."""
    return to_numpy(t).view(np.uint8)
