"""CUDA graph capture for compiled steps: a private memory pool and a capture stream.

Everything a captured step allocates comes from a memory pool that belongs to the compiled
step alone, so no other code can ever be handed memory that a replay writes into. The step
runs once eagerly in that pool first (planning every matmul, compiling every kernel, and
leaving blocks of every size the step needs cached), so that the capture itself finds all
its memory in the pool: cudaMalloc is not allowed while a stream captures.

A compiled step's batch reaches the graph's input buffers through the graph's own first
node where it can (``_cuda_graph_inputs``: ``capture(..., inputs=...)``); otherwise it is
copied in before each launch (``copy_into``).
"""

from __future__ import annotations

import contextlib
import weakref

import cupy

from fuseflow._namespace import set_host_sync_allowed
from fuseflow.backend import _cuda_graph_inputs as inputs_
from fuseflow.backend import _cuda_l2


class GraphCaptureError(RuntimeError):
    """The step could not be captured (it synchronised with the host, for example)."""


class GraphCapture:
    def __init__(self):
        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        #: (pointer, bytes) of ``flat_copies``' buffer, which the capture marks persisting
        #: in L2 (``_cuda_l2``); None: no window
        self.persist = None
        self.persist_hit_ratio = 0.0

    @staticmethod
    def casts_in_copy(src, dst) -> bool:
        """Whether a compiled step's ``cast_args`` cast a ``src`` batch to ``dst`` in the
        batch's copy (one pass over the batch) rather than at the start of the graph
        (``_cuda_graph_inputs``; it casts no 16-bit format to the other)."""
        return inputs_.CAST_IN_COPY and inputs_.casts(src, dst)

    @staticmethod
    def l2_persistence(nbytes: int) -> bool:
        """Whether a step whose donated arrays take ``nbytes`` keeps them in L2
        (``_cuda_l2``)."""
        return _cuda_l2.enabled(nbytes)

    def flat_copies(self, arrays):
        """C-contiguous copies of the CuPy ``arrays``, side by side in one buffer of the
        private pool (each at a 256-byte boundary), which the capture marks persisting."""
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // 256) * 256
        with self.scope():
            flat = cupy.empty(max(total, 1), dtype=cupy.uint8)
            out = []
            for a, o in zip(arrays, offsets):
                v = flat[o:o + a.nbytes].view(a.dtype).reshape(a.shape)
                v[...] = a
                out.append(v)
        self.stream.synchronize()
        self.persist = (flat.data.ptr, total)
        # when the step goes, so do its lines' persisting marks (not at interpreter exit)
        weakref.finalize(self, _cuda_l2.reset).atexit = False
        return out

    @contextlib.contextmanager
    def scope(self):
        """Allocate from the private pool, run on the capture stream, no host syncs."""
        previous = set_host_sync_allowed(False)
        try:
            with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
                yield
        finally:
            set_host_sync_allowed(previous)

    def run(self, fn):
        """Run ``fn()`` eagerly inside the scope (warm-up) and wait for it."""
        with self.scope():
            out = fn()
        self.stream.synchronize()
        return out

    def capture(self, fn, inputs=()):
        """``(fn(), graph, copy)``: fn's GPU work recorded into a graph instead of run.

        With ``inputs`` (at most ``COPY_PAIRS`` C-contiguous buffers that fn reads), the
        graph starts with a copy into them whose sources ``copy.set_sources`` sets before
        each launch (``_cuda_graph_inputs``); ``copy`` is None where that is not available,
        and the caller then copies the inputs in before each launch."""
        in_graph = bool(inputs) and len(inputs) <= inputs_.COPY_PAIRS and inputs_.available()
        if self.persist:  # the captured kernel nodes keep the stream's window
            self.persist_hit_ratio = _cuda_l2.set_window(self.stream, *self.persist)
        try:
            graph, out = self._record(fn, inputs if in_graph else ())
        finally:
            if self.persist:
                _cuda_l2.set_window(self.stream, 0, 0)
        copy = None
        if in_graph:
            graph.upload(self.stream)  # instantiates it: the copy node is found in the result
            copy = inputs_.InGraphCopy.find(graph, inputs)
        return out, graph, copy

    def _record(self, fn, inputs):
        """``(graph, fn())``: the stream capture itself (see ``capture``)."""
        with self.scope():
            self.stream.begin_capture()
            try:
                if inputs:  # a self-copy until set_sources points it elsewhere
                    inputs_.copy_arrays([(d, d) for d in inputs])
                out = fn()
            except BaseException as e:
                with contextlib.suppress(Exception):
                    self.stream.end_capture()
                if isinstance(e, cupy.cuda.runtime.CUDARuntimeError) or "capturing" in str(e):
                    raise GraphCaptureError(
                        f"the step could not be captured into a CUDA graph ({e}). A compiled "
                        "step must not read GPU values on the host (float(loss), .item(), "
                        "printing arrays) nor move data between host and device: return such "
                        "values as arrays and read them after the call.") from e
                raise
            return self.stream.end_capture(), out

    @staticmethod
    def launch(graph):
        """Replay on the caller's current stream (ordered with its other work)."""
        graph.launch(cupy.cuda.get_current_stream())

    @staticmethod
    def copy_into(dst, src):
        """Device-to-device copy of equal-sized contiguous arrays on the current stream;
        of another float dtype, cast (a compiled step's ``cast_args``)."""
        if src.dtype != dst.dtype:
            inputs_.copy_arrays([(dst, src)])
            return
        dst.data.copy_from_device_async(src.data, src.nbytes, cupy.cuda.get_current_stream())
