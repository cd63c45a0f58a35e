"""Tensor <-> NumPy copies for the PyTorch tests, independent of qkern.torch (under test).

Every tensor made here is a fresh torch allocation: torch._weight_int8pack_mm
(2.13) uses aligned loads and crashes on NumPy-backed memory.
"""

import numpy as np
import torch

from reference import BF16

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                BF16: torch.bfloat16}


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
