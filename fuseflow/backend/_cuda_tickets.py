"""Arrival counters for kernels whose last-arriving block finishes a reduction.

A kernel that splits a sum across blocks (split-K, column sums over batch chunks) would need
a second launch to add the partials up. Instead each block writes its partial, fences, and
takes a ticket from a counter; the block that draws the last ticket adds the partials in a
fixed order (deterministic) and sets the counter back to zero. Kernels on one stream run one
after another, so every kernel of a stream can use the same zeroed counters: one buffer per
(device, stream), made on first use and kept (64 KiB each; a graph captured on a stream
keeps using that stream's buffer, so one capture stream serves one graph: ``ff.compile``
captures each graph on a stream of its own).

The CUDA side (``TICKET_SRC``): ``last_arrival(counter, arrivals)`` is called by every
thread of a block after the block wrote its partial; it returns true in the last-arriving
block, whose reads of the others' partials must bypass L1 (``__ldcg``).
"""

from __future__ import annotations

import threading

import cupy

#: Counters per stream: enough for the largest grid of tickets a kernel here asks for.
SIZE = 1 << 14
_PER_THREAD_DEFAULT_STREAM = 2  # cudaStreamPerThread: one handle, a stream per host thread

_BUFFERS: dict = {}

TICKET_SRC = r"""
__device__ __forceinline__ bool last_arrival(unsigned int* counter, unsigned int arrivals) {
    __shared__ bool last;
    __threadfence();   // this block's partials are visible before its ticket
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        const unsigned int t = atomicAdd(counter, 1u);
        last = t == arrivals - 1;
        if (last) *counter = 0u;  // reset for the stream's next kernel
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}
"""


def counters(n: int):
    """A zeroed uint32 array of at least ``n`` counters for the current stream's kernels."""
    if n > SIZE:
        raise ValueError(f"a kernel asked for {n} arrival counters; at most {SIZE} exist")
    stream = cupy.cuda.get_current_stream()
    thread = threading.get_ident() if stream.ptr == _PER_THREAD_DEFAULT_STREAM else None
    key = (cupy.cuda.runtime.getDevice(), stream.ptr, thread)
    buf = _BUFFERS.get(key)
    if buf is None:
        if stream.is_capturing():
            raise RuntimeError(
                "arrival counters for this stream were not made before the graph capture "
                "(the eager warm-up run should have made them)")
        # From the default pool (not a compiled step's private one): the buffer outlives it.
        mem = cupy.get_default_memory_pool().malloc(SIZE * 4)
        buf = cupy.ndarray((SIZE,), dtype=cupy.uint32, memptr=mem)
        cupy.cuda.runtime.memsetAsync(buf.data.ptr, 0, SIZE * 4, stream.ptr)
        _BUFFERS[key] = buf
    return buf
