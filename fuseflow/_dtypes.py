"""The floating dtypes fuseflow computes in, bfloat16 among them.

NumPy has no bfloat16; ml_dtypes (JAX's) adds one that NumPy's ufuncs and CuPy 14's arrays
accept. Its dtype's ``kind`` is "V", not "f", so code asks ``is_float`` rather than
``dtype.kind == "f"``, and ``accumulation`` for the dtype sums are kept in (both 16-bit
formats accumulate in float32, as cuBLASLt's COMPUTE_32F does).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["bfloat16", "HALF", "FLOATS", "is_float", "is_half", "accumulation"]

bfloat16 = np.dtype(ml_dtypes.bfloat16)
HALF = (np.dtype(np.float16), bfloat16)
FLOATS = (*HALF, np.dtype(np.float32), np.dtype(np.float64))


def is_float(dtype) -> bool:
    """One of fuseflow's floating dtypes (float16, bfloat16, float32, float64)."""
    return dtype is not None and np.dtype(dtype) in FLOATS


def is_half(dtype) -> bool:
    """A 16-bit floating dtype (float16 or bfloat16)."""
    return dtype is not None and np.dtype(dtype) in HALF


def accumulation(dtype) -> np.dtype:
    """The dtype sums of ``dtype`` values are formed in: float32 for the 16-bit ones."""
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)
