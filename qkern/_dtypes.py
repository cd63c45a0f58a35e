"""The activation dtypes qkern accepts and their C codes (qk_dtype)."""

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

# name -> qk_dtype code (include/qkern/woq.h)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
# name -> numpy dtype (bfloat16 first: the benchmarks' tables follow this order)
DTYPES = {"bfloat16": bfloat16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
_BY_DTYPE = {dt: name for name, dt in DTYPES.items()}


def dtype_name(dtype, arg: str = "x") -> str:
    """Canonical name of a supported activation dtype; TypeError naming ``arg`` otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in _BY_DTYPE:
        raise TypeError(f"{arg}: expected dtype float32, float16 or bfloat16, got {dtype}")
    return _BY_DTYPE[dt]


def dtype_code(dtype) -> int:
    """qk_dtype code of a supported activation dtype."""
    return DTYPE_CODES[dtype_name(dtype)]
