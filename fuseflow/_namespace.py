"""Which array library an array belongs to (numpy or cupy), without importing cupy.

The lowest module of the package: tree helpers, optimizers and losses use it to write one
piece of array code that runs unchanged on NumPy and CuPy arrays.
"""

from __future__ import annotations

import sys

import numpy as np


def is_cupy(x) -> bool:
    return type(x).__module__.startswith("cupy")


def is_array(x) -> bool:
    """An array of any backend (NumPy, CuPy; shape and dtype), not a Python value."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def namespace(x):
    """Return the array module (``numpy`` or ``cupy``) that owns ``x``."""
    if is_cupy(x):
        return sys.modules["cupy"]
    return np


_HOST_SYNC_ALLOWED = [True]


def host_sync_allowed() -> bool:
    """False while a step is being captured into a CUDA graph: checks that read device
    values back to the host (label ranges, say) must be skipped then."""
    return _HOST_SYNC_ALLOWED[0]


def set_host_sync_allowed(allowed: bool) -> bool:
    """Set the flag; returns the previous value (the graph capture restores it)."""
    previous, _HOST_SYNC_ALLOWED[0] = _HOST_SYNC_ALLOWED[0], allowed
    return previous


def device_of(x) -> str:
    """``"cuda"`` for a CuPy array, ``"cpu"`` for anything else."""
    return "cuda" if is_cupy(x) else "cpu"
