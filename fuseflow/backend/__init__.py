"""Array backends: the NumPy reference and CuPy + nvmath-python, behind one interface.

Layers never choose a backend by name: ``of(*arrays)`` returns the backend that owns the
arrays (NumPy arrays -> numpy, CuPy arrays -> cuda), so one model runs on either device
depending on where its params and inputs live. Nothing outside this package imports cupy or
nvmath.
"""

from __future__ import annotations

import numpy as np

from fuseflow._namespace import device_of, is_array, is_cupy, namespace
from fuseflow import tree as _tree
from fuseflow._dtypes import is_float, is_half
from fuseflow.backend.base import DLPACK_GPU_DEVICES, Backend, BackendError
from fuseflow.backend.numpy_backend import NumpyBackend

__all__ = [
    "Backend",
    "BackendError",
    "asarray",
    "cuda_available",
    "device_of",
    "device_put",
    "get",
    "graph_capture",
    "namespace",
    "of",
    "reset_stats",
    "resolve",
    "stats",
]

_BACKENDS: dict = {"numpy": NumpyBackend()}
_cuda_error: str | None = None


def cuda_available() -> bool:
    """True when CuPy, nvmath-python and a CUDA GPU are all present."""
    return _load_cuda() is not None


def _load_cuda():
    global _cuda_error
    if "cuda" in _BACKENDS:
        return _BACKENDS["cuda"]
    if _cuda_error is not None:
        return None
    try:
        from fuseflow.backend.cuda_backend import CudaBackend

        _BACKENDS["cuda"] = CudaBackend()
    except Exception as e:  # noqa: BLE001 - missing package, no driver, no device
        _cuda_error = f"{type(e).__name__}: {e}"
        return None
    return _BACKENDS["cuda"]


def get(name: str = "numpy") -> Backend:
    """The backend called ``name``: "numpy", "cuda" or "auto" (cuda when usable, else numpy)."""
    name = resolve(name)
    if name == "cuda":
        be = _load_cuda()
        if be is None:
            raise RuntimeError("the CUDA backend is not available (" + str(_cuda_error) + "). "
                               "Fix: pip install 'fuseflow[cuda13]' on a machine with an NVIDIA "
                               "GPU, or use backend='numpy'.")
        return be
    return _BACKENDS["numpy"]


def resolve(name: str) -> str:
    """Turn "auto" into "cuda" or "numpy"; validate other names."""
    if name == "auto":
        return "cuda" if cuda_available() else "numpy"
    if name in ("numpy", "cpu"):
        return "numpy"
    if name in ("cuda", "gpu"):
        return "cuda"
    raise ValueError(f"unknown backend {name!r}; expected 'auto', 'numpy' or 'cuda'")


def of(*arrays, where: str = "fuseflow") -> Backend:
    """The backend owning ``arrays``; a clear error when host and device arrays are mixed."""
    devices = {device_of(a) for a in arrays if a is not None}
    if len(devices) > 1:
        raise BackendError(
            f"{where}: got both host (NumPy) and GPU (CuPy) arrays. The model's params and its "
            "inputs must live on one device. Fix: ff.device_put(x, 'cuda') (or 'cpu') for the "
            "input, or ff.device_put(params, ...) for the model.")
    return get("cuda") if devices == {"cuda"} else _BACKENDS["numpy"]


def use_device(index: int):
    """Make GPU ``index % count`` current (one GPU per rank in data-parallel training)."""
    cupy = __import__("cupy")
    cupy.cuda.Device(index % cupy.cuda.runtime.getDeviceCount()).use()


def nccl_sum(size: int, rank: int, mpi_comm=None):
    """A callable that sums a flat CuPy array in place over all ranks (NCCL)."""
    get("cuda")
    from fuseflow.backend._nccl import NcclSum

    return NcclSum(size, rank, mpi_comm)


def graph_capture():
    """A fresh CUDA graph capture context (private pool + stream) for ``ff.compile``."""
    get("cuda")
    from fuseflow.backend._cuda_graph import GraphCapture

    return GraphCapture()


def stats() -> dict:
    """Call counts per op (and, on CUDA, plans made, planning time, executions) per backend."""
    return {name: be.stats() for name, be in _BACKENDS.items()}


def reset_stats():
    for be in _BACKENDS.values():
        be.reset_stats()


def _map_leaves(fn, tree):
    return _tree.map(fn, tree)


def device_put(tree, device: str = "cuda"):
    """Copy every array leaf of ``tree`` to ``device`` ("cuda"/"gpu" or "cpu"/"numpy")."""
    be = get(resolve(device))
    return _map_leaves(lambda a: be.asarray(a) if hasattr(a, "shape") else a, tree)


def asarray(x, dtype=None):
    """Take an array from anywhere (NumPy, CuPy, or PyTorch/JAX through DLPack).

    A GPU tensor stays on the GPU and is not copied (DLPack); a CPU one becomes NumPy.
    """
    if isinstance(x, np.ndarray) or is_cupy(x):
        return x if dtype is None else x.astype(dtype, copy=False)
    dev = getattr(x, "__dlpack_device__", None)
    on_gpu = dev is not None and dev()[0] in DLPACK_GPU_DEVICES
    return get("cuda" if on_gpu else "numpy").asarray(x, dtype=dtype)



def fusable(leaves, max_leaves=64):
    """Leaves one multi-tensor kernel (cast, finiteness) can take: CuPy, one float dtype,
    C-contiguous, at most ``max_leaves``."""
    if not leaves or len(leaves) > max_leaves or not all(is_cupy(a) for a in leaves):
        return False
    dtype = leaves[0].dtype
    return is_float(dtype) and all(a.dtype == dtype and a.flags.c_contiguous for a in leaves)


def multi_tensor_cast(leaves, dtype, scale=None):
    """``[leaf.astype(dtype) * scale]`` (scale: a 0-d array or None): one launch for all
    leaves on the GPU (scaled casts: to float32), one operation per leaf elsewhere."""
    leaves = list(leaves)
    if fusable(leaves) and (scale is None or (is_cupy(scale) and np.dtype(dtype) == np.float32)):
        from fuseflow.backend import _cuda_fused

        get("cuda").calls["multi_tensor_cast"] += 1
        return _cuda_fused.multi_tensor_cast(leaves, dtype, scale)
    if scale is None:
        return [a.astype(dtype) for a in leaves]
    return [a.astype(dtype) * scale.astype(dtype) for a in leaves]


def all_finite(leaves, scale=None, inverse_into=None):
    """A 0-d bool array: every element of every leaf is finite (one launch on the GPU).

    ``scale`` (a 0-d float32 array): check ``leaf.astype(float32) * scale`` instead, the
    unscaled gradients of mixed precision, without materializing them. ``inverse_into`` (a
    0-d float32 array, with ``scale``): the factor is ``1 / scale``, stored there too (on
    the GPU by the same kernel: mixed precision's unscaling factor without a launch).
    """
    leaves = list(leaves)
    if inverse_into is not None:
        if scale is None or not is_array(inverse_into) or inverse_into.shape != () \
                or inverse_into.dtype != np.float32:
            raise ValueError("all_finite: inverse_into needs a scale and a 0-d float32 array, "
                             f"got scale={scale!r}, inverse_into={type(inverse_into).__name__}"
                             f" of shape {getattr(inverse_into, 'shape', None)} and dtype "
                             f"{getattr(inverse_into, 'dtype', None)}")
    if fusable(leaves) and (scale is None or is_cupy(scale)) and \
            (inverse_into is None or is_cupy(inverse_into)):
        from fuseflow.backend import _cuda_fused

        get("cuda").calls["all_finite"] += 1
        return _cuda_fused.multi_tensor_all_finite(leaves, scale, inverse_into)
    if inverse_into is not None:
        xp = namespace(inverse_into)
        inverse_into[...] = 1.0 / xp.asarray(scale, dtype=xp.float32)
        scale = inverse_into
    xp = namespace(leaves[0])
    ok = xp.asarray(True)
    for g in leaves:  # element by element, as the fused kernel checks
        if scale is not None:
            g = g.astype(xp.float32) * scale.astype(xp.float32)
        ok = ok & xp.isfinite(g).all()
    return ok


def next_loss_scale(finite, scale, good_steps, growth_interval, growth_factor,
                    backoff_factor, min_scale):
    """``(scale, good_steps)`` after one step of dynamic loss scaling, in one launch on the
    GPU; None for NumPy arrays (the caller, ``mixed_precision``, runs its reference)."""
    arrays = {np.bool_: finite, np.float32: scale, np.int32: good_steps}
    if not all(is_cupy(a) and a.dtype == t and a.ndim == 0 for t, a in arrays.items()):
        return None
    from fuseflow.backend import _cuda_fused

    get("cuda").calls["next_loss_scale"] += 1
    return _cuda_fused.next_loss_scale(finite, scale, good_steps, growth_interval,
                                       growth_factor, backoff_factor, min_scale)


def multi_tensor_update(kind, params, grads, states, *, finite=None, grad_scale=None,
                        low=None, widen_grads=False, **hyper):
    """One-launch optimizer update of many tensors on the GPU (see ``_cuda_fused``), or
    None where no fused kernel applies (NumPy arrays): the caller then runs the reference.

    ``finite``: a 0-d bool device array, or a function returning one, called only when the
    kernel runs (where False, nothing changes). ``grad_scale``: a 0-d float32 device array
    each gradient is multiplied by after its cast to the params' dtype; the grads of float32
    params may then be 16-bit (mixed precision's scaled ones), read exactly. So may they
    with ``widen_grads`` (``mixed_precision.compute_copy``'s unscaled ones: the update of
    their float32 values); otherwise the caller's reference promotes them step by step,
    rounding in 16 bits where NumPy does. ``low``: a
    lower-precision copy of the params that the kernel rewrites from the new params (it
    then returns ``(params, states, low)``).
    """
    own = list(params) + [s for group in states for s in group]
    grads = list(grads)
    scaled = grad_scale is not None
    if len(params) > 32 or not fusable(own, max_leaves=len(own)) or own[0].dtype.itemsize < 4 \
            or not fusable(grads, max_leaves=len(grads)) \
            or (low is not None and not (len(low) == len(params) and fusable(low, len(low))
                                         and all(a.shape == p.shape
                                                 for a, p in zip(low, params)))) \
            or not _reads_grads(own[0].dtype, grads[0].dtype, scaled or widen_grads) \
            or (scaled and not (is_cupy(grad_scale) and own[0].dtype == np.float32)):
        return None
    from fuseflow.backend import _cuda_fused

    cuda = get("cuda")
    if scaled:
        variant = "/scaled"
    elif grads[0].dtype != own[0].dtype:
        variant = "/16bit"
    else:
        variant = ""
    cuda.calls["multi_tensor_update/" + kind + variant] += 1
    # in place (a compiled step's donated buffers) and not skippable (no loss scaling)
    split = cuda.take_update_split(grads, usable=hyper.get("in_place") and finite is None)
    if split is not None:
        return _split_update(*split, kind, params, grads, states, grad_scale, low, hyper)
    return _cuda_fused.multi_tensor_update(
        kind, params, grads, states, finite=finite() if callable(finite) else finite,
        grad_scale=grad_scale, low=low, **hyper)


def _reads_grads(param_dtype, grad_dtype, as_float32) -> bool:
    """The update kernel takes gradients of the params' dtype, and 16-bit ones of float32
    params that it reads as float32 (``as_float32``: scaled, or standing for their float32
    values); any other mix is left to the reference, which promotes step by step."""
    return grad_dtype == param_dtype or (param_dtype == np.float32 and is_half(grad_dtype)
                                         and as_float32)


def _split_update(split, early, kind, params, grads, states, grad_scale, low, hyper):
    """The in-place update as two launches: the leaves whose gradients the side streams made
    on a side stream, the others on the main stream (``_cuda_overlap.SplitPoint``). Both
    read the same old counters; only the main stream's stores the new ones (allocated after
    the join, they may lie in memory the main stream's last work still reads), so the
    result is that of the one launch, bit for bit."""
    from fuseflow.backend import _cuda_fused

    def pick(seq, want):
        return None if seq is None else [a for a, e in zip(seq, early) if e == want]

    # the one-launch kernel too: a later capture that cannot split must not compile it
    _cuda_fused.multi_tensor_update(kind, params, grads, states, grad_scale=grad_scale,
                                    low=low, compile_only=True, **hyper)
    get("cuda").release_update_split(split)
    side = {"new_count": None, "new_sched_count": None,
            "bump_count": hyper.get("new_count") is not None}
    for want, stream in ((True, split.side), (False, split.main)):
        with stream:
            _cuda_fused.multi_tensor_update(
                kind, pick(params, want), pick(grads, want),
                [pick(group, want) for group in states], grad_scale=grad_scale,
                low=pick(low, want), **{**hyper, "decays": pick(hyper.get("decays"), want),
                                        **(side if want else {})})
    split.rejoin()
    return (params, states) if low is None else (params, states, low)
