"""Weight gradients on a second stream, overlapping the input-gradient chain.

In a backward pass the input-gradient matmuls form a chain (each needs the one above), but
a layer's weight gradient is needed by nothing until the optimizer. At MNIST scale a single
matmul leaves most of the GPU idle (batch 256: cuBLASLt's float32 kernels run one or two
blocks per SM), so running the weight gradients on a second stream, beside the chain, shortens
the step. A CUDA graph captured across the two streams keeps the concurrency (fork and join
become graph edges).

``OverlapScope.fork()`` makes the side stream of the current stream wait for everything
issued so far and returns it; ``join()`` makes each forked-from stream wait for its side
stream. Between the two, the scope keeps the inputs the side stream reads alive: the memory
pool must not hand them to later work on the main stream while the side stream may still
read them. The side stream's own allocations are safe without that: a pool block returns
to the arena of the stream that allocated it, and every later side-stream use starts with a
fork, that is after everything the main stream had issued, including the block's last reads.

One side stream per (device, main stream, host thread), made on first use and kept: a graph
captured on a stream keeps its side nodes' per-stream resources (the arrival counters of
``_cuda_tickets``) to itself, as ``ff.compile`` gives every graph a capture stream of its
own. (So every compiled signature and every training thread leaves one stream behind; a
stream costs little, and a graph may replay for as long as its step lives.)

A plan's cuBLASLt workspace is shared by every execution of that plan, so the backend keys
the side stream's weight-gradient plans apart from the main stream's ("wgrad/side"): a
layer whose weight gradient stays on the main stream (a Dense subclass, a custom layer)
never runs the plan of a same-shaped overlapped one at the same time.
"""

from __future__ import annotations

import threading

import cupy

_SIDE_STREAMS: dict = {}


def _side_stream(device: int, main) -> cupy.cuda.Stream:
    # the key holds the calling thread: no other thread ever makes this entry (no lock)
    key = (device, main.ptr, threading.get_ident())
    side = _SIDE_STREAMS.get(key)
    if side is None:
        side = _SIDE_STREAMS[key] = cupy.cuda.Stream(non_blocking=True)
    return side


def _event_on(stream) -> cupy.cuda.Event:
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record(stream)
    return ev


class OverlapScope:
    """One backward pass's forks to side streams (see the module docstring)."""

    def __init__(self):
        self._forks = {}  # (device, main stream ptr) -> (device, main, side)
        self._keep = []

    def fork(self, *reads) -> cupy.cuda.Stream:
        """The current stream's side stream, after all the current stream's work so far;
        ``reads`` (arrays the side work reads) stay alive until ``join``."""
        device = cupy.cuda.runtime.getDevice()
        main = cupy.cuda.get_current_stream()
        side = _side_stream(device, main)
        side.wait_event(_event_on(main))
        self._forks[(device, main.ptr)] = (device, main, side)
        self._keep.append(reads)
        return side

    def join(self):
        """Every forked-from stream waits for its side stream (each one tried, the first
        error raised after); the kept inputs are let go once all have been joined."""
        error = None
        for device, main, side in self._forks.values():
            try:
                with cupy.cuda.Device(device):
                    main.wait_event(_event_on(side))
            except Exception as e:  # noqa: BLE001 - join the others, then raise it
                error = error or e
        self._forks.clear()
        if error is not None:
            raise error  # the inputs stay kept: a stream that did not join may still read
        self._keep.clear()
