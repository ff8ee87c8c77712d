"""Keeping a compiled step's params and optimizer state in the GPU's L2 cache.

A training step at MNIST scale touches its params and optimizer state once for the update
(Adam: read params, grads and both moments, write params and moments: 52 MB for the
784-1024-1024-10 model), which then comes from DRAM. The H200's L2 cache (50 MB) could hold
them from one step to the next. CUDA lets part of L2 be set aside for "persisting" lines
and a stream mark one address range as such (an access policy window); kernel nodes
captured from that stream keep the window. So a compiled step whose donated arrays sit in
one buffer (``GraphCapture.flat_copies``) captures with a window over that buffer.

``FUSEFLOW_L2_PERSIST``: 0 (the default) never; "auto" where the donated arrays fit in the
L2 the GPU lets be set aside (the whole window persists: MNIST-scale models); 1 always (a
larger window persists in part). Measured on the H200 (docs/benchmarks-log.md, calls 83-84):
MNIST epochs of the medium Adam step 2.4-3.8% faster with it, steps on a fixed batch no
faster; off by default until its effect on the work that follows it in a process (the
set-aside stays reserved) has been measured. On an H100 (call 163) the medium Adam step's
MNIST epochs were 1.4% faster with "auto" and the small model's steps 2-3% slower.
"""

from __future__ import annotations

import ctypes

import cupy

from fuseflow.backend import _libcuda
from fuseflow.backend._env import AUTOTUNE_MODES, env_choice

_LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize
_ATTR_MAX_PERSISTING_L2 = 108  # cudaDevAttrMaxPersistingL2CacheSize
_ATTR_MAX_WINDOW = 109  # cudaDevAttrMaxAccessPolicyWindowSize
_ACCESS_POLICY_WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
_NORMAL, _STREAMING, _PERSISTING = 0, 1, 2  # CUaccessProperty


class _Window(ctypes.Structure):  # CUaccessPolicyWindow
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hitRatio", ctypes.c_float), ("hitProp", ctypes.c_int),
                ("missProp", ctypes.c_int)]


class _AttrValue(ctypes.Union):  # CUlaunchAttributeValue (64 bytes)
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 64)]


def enabled(nbytes: int) -> bool:
    """Whether a step whose donated arrays take ``nbytes`` keeps them in L2 (the setting
    is read on each compile; see the module docstring)."""
    mode = env_choice("FUSEFLOW_L2_PERSIST", AUTOTUNE_MODES, False)
    if not mode or _set_attribute() is None:
        return False
    if mode == "auto":
        dev = cupy.cuda.runtime.getDevice()
        return 0 < nbytes <= cupy.cuda.runtime.deviceGetAttribute(_ATTR_MAX_PERSISTING_L2, dev)
    return True


def _set_attribute():
    return _libcuda.entry("cuStreamSetAttribute")


def reset():
    """Turn every persisting L2 line of the current context back to normal: a freed
    step's lines must not keep their L2 space from the work that follows."""
    fn = _libcuda.entry("cuCtxResetPersistingL2Cache")
    if fn is not None:
        fn()


def set_window(stream, ptr: int, nbytes: int) -> float:
    """Mark ``[ptr, ptr + nbytes)`` persisting for the kernels ``stream`` runs or captures
    from now on (``nbytes`` 0: no window), after setting L2 aside for it; returns the
    window's hit ratio (the share of it that the set-aside holds)."""
    dev = cupy.cuda.runtime.getDevice()
    value = _AttrValue()
    ratio = 0.0
    if nbytes:
        most = cupy.cuda.runtime.deviceGetAttribute(_ATTR_MAX_PERSISTING_L2, dev)
        nbytes = min(nbytes, cupy.cuda.runtime.deviceGetAttribute(_ATTR_MAX_WINDOW, dev))
        aside = min(most, nbytes)
        if cupy.cuda.runtime.deviceGetLimit(_LIMIT_PERSISTING_L2) < aside:
            cupy.cuda.runtime.deviceSetLimit(_LIMIT_PERSISTING_L2, aside)
        ratio = min(1.0, cupy.cuda.runtime.deviceGetLimit(_LIMIT_PERSISTING_L2) / nbytes)
        value.window = _Window(ptr, nbytes, ratio, _PERSISTING, _STREAMING)
    err = _set_attribute()(ctypes.c_void_p(stream.ptr), _ACCESS_POLICY_WINDOW,
                           ctypes.byref(value))
    if err:
        raise RuntimeError(f"cuStreamSetAttribute (access policy window) failed: CUresult {err}")
    return ratio
