"""A captured graph's memset nodes, run as kernel nodes.

cuBLASLt zeroes a little of its workspace with cudaMemsetAsync before some of its Hopper
matmul kernels: in the large model's 16-bit step, before both forwards and both 4096-wide
backward matmuls (H200, call 85's timeline, docs/benchmarks.md). Captured, each is a
memset node, and the matmul after it started 3-5 us after the memset's end, where a kernel
after a kernel starts within half a microsecond: about 19 us of idle GPU per step. (Transformer
Engine and TensorRT-LLM replaced their own memsets with kernels for the same gap.)

So after a capture, ``without_memsets`` turns every memset node of the graph into a node of
``fill_node``, a kernel that stores the same value over the same (pitched) range, with the
same incoming and outgoing edges, and instantiates the result. The graph CuPy instantiated
at the end of the capture is kept, unused, by the returned ``Graph``, which launches the
new one. Where the driver lacks an entry point, or any step fails, the graph stays as it
was captured.
"""

from __future__ import annotations

import ctypes
import functools
import weakref

import cupy
import numpy as np

from fuseflow.backend import _libcuda
from fuseflow.backend._env import env_choice

#: "kernel" (default): memset nodes become fill kernels; "keep": the graph as captured
#: (FUSEFLOW_GRAPH_MEMSETS; benchmarks switch ``ENABLED`` for side-by-sides).
ENABLED = env_choice("FUSEFLOW_GRAPH_MEMSETS", {"kernel": True, "keep": False}, True)

_FILL_SRC = r"""
// what a memset node stores: height rows of width elements of elsize bytes, pitch bytes apart
extern "C" __global__ void fill_node(char* dst, unsigned long long pitch, unsigned int value,
                                     unsigned int elsize, unsigned long long width,
                                     unsigned long long height) {
    const unsigned long long n = width * height;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long row = i / width;
        char* p = dst + row * pitch + (i - row * width) * elsize;
        if (elsize == 4) *reinterpret_cast<unsigned int*>(p) = value;
        else if (elsize == 2) *reinterpret_cast<unsigned short*>(p) = (unsigned short)value;
        else *p = (char)value;
    }
}
"""
_THREADS = 256


@functools.cache
def _fill_kernel():
    return cupy.RawKernel(_FILL_SRC, "fill_node")


class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t),
                ("value", ctypes.c_uint), ("elementSize", ctypes.c_uint),
                ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte),
                ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]


def _driver():
    return _libcuda.entries(
        memset_params="cuGraphMemsetNodeGetParams",
        dependencies="cuGraphNodeGetDependencies_v2",
        dependents="cuGraphNodeGetDependentNodes_v2",
        add_kernel="cuGraphAddKernelNode_v2", add_edges="cuGraphAddDependencies_v2",
        destroy_node="cuGraphDestroyNode", instantiate="cuGraphInstantiateWithFlags",
        upload="cuGraphUpload", launch="cuGraphLaunch", destroy_exec="cuGraphExecDestroy")


class Graph:
    """A rewritten graph's executable, in the place of CuPy's ``Graph`` for
    ``GraphCapture`` (``graph``, ``graphExec``, ``launch``, ``upload``). It keeps CuPy's
    graph, which owns the CUgraph (and the executable instantiated before the rewrite)."""

    def __init__(self, captured, graph_exec: int, replaced: int):
        self._captured = captured
        self.graph = captured.graph
        self.graphExec = graph_exec
        #: memset nodes that became fill kernels
        self.replaced = replaced
        self._exec = ctypes.c_void_p(graph_exec)
        self._launch, self._upload = _driver()["launch"], _driver()["upload"]
        # freed on completion where launches are still in flight (cuGraphExecDestroy)
        weakref.finalize(self, _driver()["destroy_exec"], ctypes.c_void_p(graph_exec))

    def _stream(self, stream):
        return (stream or cupy.cuda.get_current_stream()).ptr

    def launch(self, stream=None):
        err = self._launch(self._exec, ctypes.c_void_p(self._stream(stream)))
        if err:
            raise RuntimeError(f"cuGraphLaunch failed (CUresult {err})")

    def upload(self, stream=None):
        err = self._upload(self._exec, ctypes.c_void_p(self._stream(stream)))
        if err:
            raise RuntimeError(f"cuGraphUpload failed (CUresult {err})")


def without_memsets(captured):
    """``captured`` (a CuPy graph fresh from a stream capture) with its memset nodes as
    fill kernels, instantiated: a ``Graph``; None where it has no memset node, rewriting is
    off or unavailable, or a driver call failed (the caller keeps ``captured``)."""
    drv = _driver() if ENABLED else None
    graph = getattr(captured, "graph", 0)
    if drv is None or not graph:
        return None
    nodes = _libcuda.graph_nodes(graph)
    memsets = [n for n in nodes or () if _libcuda.node_type(n) == _libcuda.MEMSET_NODE]
    if not memsets:
        return None
    func = _fill_kernel().kernel.ptr  # loaded before any node names it
    for node in memsets:
        if not _replace(drv, graph, node, func):
            return None  # the graph is half rewritten: keep the captured executable
    exe = ctypes.c_void_p(0)
    if drv["instantiate"](ctypes.byref(exe), ctypes.c_void_p(graph), ctypes.c_ulonglong(0)):
        return None
    return Graph(captured, exe.value, len(memsets))


def _edges(fn, node):
    """``(nodes, edge data)`` of ``node``'s incoming or outgoing edges, via ``fn``."""
    count = ctypes.c_size_t(0)
    if fn(ctypes.c_void_p(node), None, None, ctypes.byref(count)):
        return None
    others = (ctypes.c_void_p * max(count.value, 1))()
    data = (_EdgeData * max(count.value, 1))()
    if count.value and fn(ctypes.c_void_p(node), others, data, ctypes.byref(count)):
        return None
    return others, data, count.value


def _replace(drv, graph, node, func) -> bool:
    """Put a fill-kernel node in the place of memset ``node`` (same edges, same bytes)."""
    p = _MemsetParams()
    if drv["memset_params"](ctypes.c_void_p(node), ctypes.byref(p)):
        return False
    if p.elementSize not in (1, 2, 4):
        return False
    incoming, outgoing = _edges(drv["dependencies"], node), _edges(drv["dependents"], node)
    if incoming is None or outgoing is None:
        return False
    n = p.width * p.height
    args = [ctypes.c_uint64(p.dst), ctypes.c_uint64(p.pitch), ctypes.c_uint(p.value),
            ctypes.c_uint(p.elementSize), ctypes.c_uint64(p.width), ctypes.c_uint64(p.height)]
    pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    params = _libcuda.KernelNodeParams(
        func=func, gridDimX=int(np.clip(-(-n // _THREADS), 1, 1024)), gridDimY=1, gridDimZ=1,
        blockDimX=_THREADS, blockDimY=1, blockDimZ=1, sharedMemBytes=0,
        kernelParams=ctypes.cast(pointers, ctypes.c_void_p), extra=None, kern=None, ctx=None)
    fill = ctypes.c_void_p(0)
    if drv["add_kernel"](ctypes.byref(fill), ctypes.c_void_p(graph), None, ctypes.c_size_t(0),
                         ctypes.byref(params)):
        return False
    # the memset's edges, kept as they were (their ports and types), now on the fill node
    (ins, in_data, n_in), (outs, out_data, n_out) = incoming, outgoing
    for src, dst, data, count in ((ins, None, in_data, n_in), (None, outs, out_data, n_out)):
        if not count:
            continue
        fills = (ctypes.c_void_p * count)(*([fill.value] * count))
        if drv["add_edges"](ctypes.c_void_p(graph), src or fills, dst or fills, data,
                            ctypes.c_size_t(count)):
            return False
    return not drv["destroy_node"](ctypes.c_void_p(node))
