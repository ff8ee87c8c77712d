"""A compiled step's batch, copied into the graph's input buffers by the graph itself.

Every call of a compiled step brings a new batch at a new address, and the graph reads
fixed buffers. Copying the batch in before the launch is stream work outside the graph,
and a graph launched behind such work started its first kernel about 5 us after that work
ended (H200, the medium model: docs/benchmarks.md), while back-to-back replays follow each
other within a microsecond. So the graph's first node is ``copy_arrays``' kernel, captured
reading the input buffers themselves (a harmless self-copy), and before each launch
``InGraphCopy.set_sources`` points it at the call's arrays: cuGraphExecKernelNodeSetParams
changes the kernel's arguments for the launches that follow, without stream work.

The copy can also cast (float16, bfloat16, float32 and float64; not 16-bit to 16-bit), for
a step compiled with ``cast_args``: the graph then reads a float32 batch once and writes its
16-bit copy once, where copying it in and casting it inside the step read it twice and
wrote it twice (the large model's batch: 14.9 + 8.0 us on the H200, docs/benchmarks-log.md).

``copy_arrays`` is also how a compiled step writes its donated results back into its
input buffers inside the graph (kernel nodes rather than copy-engine memcpy nodes).
"""

from __future__ import annotations

import ctypes
import functools

import cupy
import numpy as np

from fuseflow._dtypes import bfloat16, is_half
from fuseflow.backend import _libcuda
from fuseflow.backend._cuda_fused import EXACT_CASTS

#: Arrays that one launch of the copy kernel copies.
COPY_PAIRS = 4
#: Values the copy kernel takes per pair: source, destination, count, conversion.
_ARGS_PER_PAIR = 4

#: The conversions the copy kernel makes (``conversion`` below), by element type.
_TYPE_CODES = {np.dtype(np.float16): 1, np.dtype(np.float32): 2, np.dtype(np.float64): 3,
               bfloat16: 4}
#: The casts the kernel has (the two 16-bit formats are not cast to each other).
_CASTS = {(a, b) for a in _TYPE_CODES for b in _TYPE_CODES
          if a != b and not (is_half(a) and is_half(b))}

_COPY_SRC = EXACT_CASTS + r"""template <typename X> struct alignas(8 * sizeof(X)) vec8 { X v[8]; };

// n elements from S to D, each as ff_cast<D>(s): the rounding of multi_tensor_cast's kernel.
// 8 elements a step where both addresses allow, one at a time elsewhere.
template <typename S, typename D>
__device__ void convert(const char* s_, char* d_, long long n, long long first,
                        long long step) {
    const S* s = reinterpret_cast<const S*>(s_);
    D* d = reinterpret_cast<D*>(d_);
    long long done = 0;
    if ((unsigned long long)s_ % sizeof(vec8<S>) == 0 &&
            (unsigned long long)d_ % sizeof(vec8<D>) == 0) {
        const long long vecs = n / 8;
        for (long long i = first; i < vecs; i += step) {
            const vec8<S> a = reinterpret_cast<const vec8<S>*>(s)[i];
            vec8<D> b;
            #pragma unroll
            for (int u = 0; u < 8; ++u) b.v[u] = ff_cast<D>(a.v[u]);
            reinterpret_cast<vec8<D>*>(d)[i] = b;
        }
        done = vecs * 8;
    }
    for (long long i = done + first; i < n; i += step) d[i] = ff_cast<D>(s[i]);
}

// Block row p copies pair p. Conversion 0: n bytes, 16-byte words where both addresses
// allow, bytes otherwise; 8 * from + to (1 __half, 2 float, 3 double, 4 __nv_bfloat16):
// n elements, cast.
extern "C" __global__ void copy_batch(
        const char* s0, char* d0, long long n0, int c0, const char* s1, char* d1,
        long long n1, int c1, const char* s2, char* d2, long long n2, int c2,
        const char* s3, char* d3, long long n3, int c3) {
    const int p = blockIdx.y;
    const char* s = p == 0 ? s0 : p == 1 ? s1 : p == 2 ? s2 : s3;
    char* d = p == 0 ? d0 : p == 1 ? d1 : p == 2 ? d2 : d3;
    const long long n = p == 0 ? n0 : p == 1 ? n1 : p == 2 ? n2 : n3;
    const int c = p == 0 ? c0 : p == 1 ? c1 : p == 2 ? c2 : c3;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    switch (c) {
    case 8 * 1 + 2: convert<__half, float>(s, d, n, first, step); return;
    case 8 * 1 + 3: convert<__half, double>(s, d, n, first, step); return;
    case 8 * 2 + 1: convert<float, __half>(s, d, n, first, step); return;
    case 8 * 2 + 3: convert<float, double>(s, d, n, first, step); return;
    case 8 * 3 + 1: convert<double, __half>(s, d, n, first, step); return;
    case 8 * 3 + 2: convert<double, float>(s, d, n, first, step); return;
    case 8 * 4 + 2: convert<__nv_bfloat16, float>(s, d, n, first, step); return;
    case 8 * 4 + 3: convert<__nv_bfloat16, double>(s, d, n, first, step); return;
    case 8 * 2 + 4: convert<float, __nv_bfloat16>(s, d, n, first, step); return;
    case 8 * 3 + 4: convert<double, __nv_bfloat16>(s, d, n, first, step); return;
    default: break;
    }
    long long done = 0;
    if ((((unsigned long long)s | (unsigned long long)d) & 15ull) == 0) {
        const long long words = n / 16;
        for (long long i = first; i < words; i += step)
            reinterpret_cast<int4*>(d)[i] = reinterpret_cast<const int4*>(s)[i];
        done = words * 16;
    }
    for (long long i = done + first; i < n; i += step) d[i] = s[i];
}
"""


@functools.cache
def _copy_kernel():
    return cupy.RawKernel(_COPY_SRC, "copy_batch")


def casts(src, dst) -> bool:
    """The copy kernel copies ``src`` into ``dst`` (dtypes): the same, or a cast it has."""
    return np.dtype(src) == np.dtype(dst) or (np.dtype(src), np.dtype(dst)) in _CASTS


def conversion(dst, src) -> tuple[int, int]:
    """``(count, conversion)`` of the copy kernel for ``dst[...] = src``: bytes and 0 for
    one dtype, elements and the cast's code for two floating dtypes (``ValueError`` for
    sizes or dtypes it cannot copy)."""
    if src.dtype == dst.dtype:
        if src.nbytes != dst.nbytes:
            raise ValueError(f"copy_arrays: {src.nbytes} bytes into a {dst.nbytes}-byte buffer")
        return src.nbytes, 0
    if (src.dtype, dst.dtype) not in _CASTS:
        raise ValueError(f"copy_arrays: cannot cast {src.dtype} to {dst.dtype} (float16, "
                         "bfloat16, float32 and float64 convert to each other, but the two "
                         "16-bit formats only through float32)")
    if src.size != dst.size:
        raise ValueError(f"copy_arrays: {src.size} elements into a {dst.size}-element buffer")
    return src.size, 8 * _TYPE_CODES[src.dtype] + _TYPE_CODES[dst.dtype]


def copy_arrays(pairs):
    """``dst[...] = src`` for each ``(dst, src)`` of C-contiguous arrays of equal size (in
    bytes, or in elements where a floating source is cast to another floating dtype), on the
    current stream, in one kernel launch per ``COPY_PAIRS`` pairs (no copy-engine work)."""
    for k in range(0, len(pairs), COPY_PAIRS):
        _copy_launch(pairs[k:k + COPY_PAIRS])


def _copy_launch(pairs):
    args, most = [], 0
    for dst, src in pairs:
        count, code = conversion(dst, src)
        args += [src, dst, np.int64(count), np.int32(code)]
        most = max(most, src.nbytes)
    args += [np.uintp(0), np.uintp(0), np.int64(0), np.int32(0)] * (COPY_PAIRS - len(pairs))
    if most:
        _copy_kernel()((_blocks(most), len(pairs)), (256,), tuple(args))


def _blocks(nbytes):
    return min(1024, max(1, -(-nbytes // (16 * 256))))


# ---- the driver calls that repoint a captured copy node ------------------------------------
@functools.cache
def _driver():
    """The libcuda entry points, or None where any is missing (then the batch is copied
    before each launch instead). Cached: ``set_sources`` reads it before every launch."""
    return _libcuda.entries(get_params="cuGraphKernelNodeGetParams_v2",
                            set_params="cuGraphExecKernelNodeSetParams_v2")


#: False copies every compiled step's batch in before its launches (for benchmarks'
#: comparisons); steps compiled while True keep their copy nodes.
IN_GRAPH = True
#: False: a step compiled with ``cast_args`` copies its batch in as given and casts it at
#: the start of the graph, one more pass over it (the earlier form, for side-by-sides).
CAST_IN_COPY = True


def available() -> bool:
    """Whether captured copy nodes can be repointed; loads the copy kernel (which a stream
    capture must find loaded) when they can."""
    if not IN_GRAPH or _driver() is None:
        return False
    return _copy_kernel().kernel is not None


class InGraphCopy:
    """The captured copy node of a graph and the arguments it runs with next."""

    def __init__(self, graph, node, params, dsts):
        self._exec = ctypes.c_void_p(graph.graphExec)
        self._node = node
        self._params = params
        n = _ARGS_PER_PAIR * COPY_PAIRS
        self._values = (ctypes.c_uint64 * n)()
        self._pointers = (ctypes.c_void_p * n)(
            *[ctypes.addressof(self._values) + 8 * i for i in range(n)])
        self._params.kernelParams = ctypes.cast(self._pointers, ctypes.c_void_p)
        self._params.extra = None
        self._dsts = list(dsts)
        for p, d in enumerate(self._dsts):
            self._values[_ARGS_PER_PAIR * p + 1] = d.data.ptr
        self._current = None
        self._counted = False  # each pair's count and conversion, set by the first call

    @classmethod
    def find(cls, graph, dsts):
        """The graph's copy node, the one whose destinations are ``dsts`` (None if it is
        not there, or the driver calls are missing)."""
        drv = _driver()
        if drv is None or not 0 < len(dsts) <= COPY_PAIRS or not graph.graphExec:
            return None
        nodes = _libcuda.graph_nodes(graph.graph)
        func = _copy_kernel().kernel.ptr
        for node in nodes or ():
            if _libcuda.node_type(node) != _libcuda.KERNEL_NODE:
                continue
            params = _libcuda.KernelNodeParams()
            if drv["get_params"](ctypes.c_void_p(node), ctypes.byref(params)) or \
                    params.func != func or not params.kernelParams:
                continue
            args = ctypes.cast(params.kernelParams, ctypes.POINTER(ctypes.c_void_p))
            dst = [ctypes.cast(args[_ARGS_PER_PAIR * p + 1],
                               ctypes.POINTER(ctypes.c_uint64))[0] for p in range(len(dsts))]
            if dst == [d.data.ptr for d in dsts]:
                return cls(graph, ctypes.c_void_p(node), params, dsts)
        return None

    def set_sources(self, srcs):
        """Copy from ``srcs`` (C-contiguous, each of its input buffer's size, or of its
        element count in another float dtype, which the copy casts) in the launches that
        follow; a repeat of the previous sources costs nothing.

        The counts and conversions are worked out from the first call's sources and kept:
        later sources must have the same sizes and dtypes, which the caller guarantees (a
        compiled step keys its graphs on the arguments' shapes and dtypes and checks them
        before this), and which is not checked again here, on the per-call path."""
        key = tuple(s.data.ptr for s in srcs)
        if key == self._current:
            return
        if not self._counted:
            for p, (s, d) in enumerate(zip(srcs, self._dsts)):
                self._values[_ARGS_PER_PAIR * p + 2:_ARGS_PER_PAIR * p + 4] = conversion(d, s)
            self._counted = True
        for p, s in enumerate(srcs):
            self._values[_ARGS_PER_PAIR * p] = s.data.ptr
        err = _driver()["set_params"](self._exec, self._node, ctypes.byref(self._params))
        if err:
            self._current = None
            raise RuntimeError(f"cuGraphExecKernelNodeSetParams failed (CUresult {err}): the "
                               "compiled step's batch could not be pointed at")
        self._current = key
