"""The CUDA driver's entry points that CuPy does not wrap, through ctypes.

Each is looked up once by its exported symbol name (versioned names such as
``cuGraphKernelNodeGetParams_v2`` included); None where the driver is missing or lacks it,
so callers fall back to a path without it.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _lib():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


@functools.cache
def entry(symbol: str):
    """The driver function ``symbol`` (returning a CUresult), or None."""
    lib = _lib()
    fn = getattr(lib, symbol, None) if lib is not None else None
    if fn is not None:
        fn.restype = ctypes.c_int
    return fn


def entries(**symbols):
    """``{name: function}`` for ``name=symbol`` pairs, or None if any is missing."""
    fns = {name: entry(symbol) for name, symbol in symbols.items()}
    return None if any(f is None for f in fns.values()) else fns


class KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (the v2 layout, CUDA 12+)."""
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint),
                ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


#: CUgraphNodeType of a kernel node
KERNEL_NODE = 0


def graph_nodes(graph: int):
    """The nodes of the CUgraph ``graph`` (None if the driver call is missing or fails)."""
    get = entry("cuGraphGetNodes")
    if get is None or not graph:
        return None
    count = ctypes.c_size_t(0)
    if get(ctypes.c_void_p(graph), None, ctypes.byref(count)):
        return None
    nodes = (ctypes.c_void_p * count.value)()
    if count.value and get(ctypes.c_void_p(graph), nodes, ctypes.byref(count)):
        return None
    return list(nodes[:count.value])


def node_type(node) -> int:
    """The CUgraphNodeType of ``node`` (-1 if it cannot be read)."""
    fn = entry("cuGraphNodeGetType")
    kind = ctypes.c_int(-1)
    if fn is None or fn(ctypes.c_void_p(node), ctypes.byref(kind)):
        return -1
    return kind.value


#: CUstreamCaptureStatus of a stream that is capturing
CAPTURE_ACTIVE = 1
#: cuStreamUpdateCaptureDependencies' flag: replace the stream's dependency set
SET_CAPTURE_DEPENDENCIES = 1


def capture_info(stream: int):
    """``(id, deps)`` of a capturing ``stream``: the id of its capture sequence (unique in
    the process) and the nodes its next node will depend on (a tuple of node handles; None
    where an edge carries data, a programmatic launch's, which ``set_capture_deps`` would
    not restore). None when it is not capturing or the driver cannot say."""
    v2 = entry("cuStreamGetCaptureInfo_v2")  # errs (lossy query) on edges with data
    get = v2 or entry("cuStreamGetCaptureInfo_v3")
    if get is None:
        return None
    status, ident, graph = ctypes.c_int(0), ctypes.c_uint64(0), ctypes.c_void_p()
    deps, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t(0)
    edges = ctypes.POINTER(ctypes.c_uint64)()  # CUgraphEdgeData: 8 bytes, all 0 = plain
    args = [ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(ident),
            ctypes.byref(graph), ctypes.byref(deps)] + ([] if v2 else [ctypes.byref(edges)]) \
        + [ctypes.byref(count)]
    if get(*args) or status.value != CAPTURE_ACTIVE:
        return None
    if edges and any(edges[i] for i in range(count.value)):
        return ident.value, None
    return ident.value, tuple(deps[i] for i in range(count.value))


def capture_deps(stream: int):
    """The dependencies of ``capture_info``, or None."""
    info = capture_info(stream)
    return None if info is None else info[1]


def set_capture_deps(stream: int, nodes) -> bool:
    """Make a capturing ``stream``'s next node depend on exactly ``nodes`` (handles from
    ``capture_deps``, plain edges); whether the driver did."""
    v2 = entry("cuStreamUpdateCaptureDependencies_v2")  # CUDA 12.3+: with edge data
    update = v2 or entry("cuStreamUpdateCaptureDependencies")
    if update is None:
        return False
    arr = (ctypes.c_void_p * max(len(nodes), 1))(*nodes)
    args = [ctypes.c_void_p(stream), arr] + ([None] if v2 else []) + \
        [ctypes.c_size_t(len(nodes)), ctypes.c_uint(SET_CAPTURE_DEPENDENCIES)]
    return update(*args) == 0
