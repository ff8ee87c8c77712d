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

Side streams per (device, main stream, host thread, index), made on first use and kept
(a scope takes ``sides`` of them in turn; the backend's ``overlap_streams``): a graph
captured on a stream keeps its side nodes' per-stream resources (the arrival counters of
``_cuda_tickets``) to itself, as ``ff.compile`` gives every graph a capture stream of its
own. (So every compiled signature and every training thread leaves its side streams
behind; a stream costs little, and a graph may replay for as long as its step lives.)

A scope opened with ``update_early=True`` (``Serial``'s, under the overlap orders "after"
and "early") also lets the optimizer update that follows start early (``SplitPoint``): the
leaves whose gradients the side stream made are updated there, beside the main stream's
last work, instead of after the join. That update waits for the side stream's work and for
the main stream's last input gradient or other layer's backward (``main_read``): in
``Serial`` a Dense stage's params are read on the main stream only by its input gradient
(and, for the output layer, by the fused head kernel issued before its fork), and any other
layer's backward (which may fork weight gradients itself) is recorded as a whole. The
update takes the split only when nothing was issued on the main stream between the join
and the update (``ready``).

Where an input gradient is a matmul plus the own ReLU-gradient pass, the recorded read is
after the pass, though the matmul is the last to read the params. Recording it after the
matmul (the update 6 us earlier, beside the pass) measured 11% slower on the medium Adam
step (docs/benchmarks-log.md, calls 166-167): launched before layer 1's weight gradient,
the update's blocks take the SMs from that matmul (33 us against 17), with or without a
capped grid. Launched after it, as now, the update runs beside it without slowing it.

A plan's cuBLASLt workspace is shared by every execution of that plan, so the backend keys
the side stream's weight-gradient plans apart from the main stream's ("wgrad/side"): a
layer whose weight gradient stays on the main stream (a Dense subclass, a custom layer)
never runs the plan of a same-shaped overlapped one at the same time.
"""

from __future__ import annotations

import threading

import cupy

from fuseflow.backend import _libcuda

_SIDE_STREAMS: dict = {}


def _side_stream(device: int, main, index: int = 0) -> cupy.cuda.Stream:
    # the key holds the calling thread: no other thread ever makes this entry (no lock)
    key = (device, main.ptr, threading.get_ident(), index)
    side = _SIDE_STREAMS.get(key)
    if side is None:
        side = _SIDE_STREAMS[key] = cupy.cuda.Stream(non_blocking=True)
    return side


def _event_on(stream) -> cupy.cuda.Event:
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record(stream)
    return ev


class OverlapScope:
    """One backward pass's forks to side streams (see the module docstring).

    ``sides``: side streams per main stream, taken in turn by successive forks (2: a short
    weight gradient forked first does not hold up the next one behind it). ``last_side``:
    the index of the side stream the latest fork returned (plans are keyed by it: a plan's
    workspace must not be used on two streams at once).
    """

    def __init__(self, update_early: bool = False, sides: int = 1):
        self._forks = {}  # (device, main stream ptr, side index) -> (device, main, side)
        self._keep = []
        self._made = []  # (start, end) of the arrays side work produced
        self._reads = []  # the main stream's capture dependencies after each input gradient
        self._update_early = update_early
        self._sides, self._count = max(1, sides), 0
        self.last_side = 0
        #: after ``join``: the SplitPoint the next optimizer update may take, or None
        self.split = None

    def fork(self, *reads) -> cupy.cuda.Stream:
        """The current stream's next side stream, after all the current stream's work so
        far; ``reads`` (arrays the side work reads) stay alive until ``join``."""
        device = cupy.cuda.runtime.getDevice()
        main = cupy.cuda.get_current_stream()
        self.last_side = self._count % self._sides
        self._count += 1
        side = _side_stream(device, main, self.last_side)
        side.wait_event(_event_on(main))
        self._forks[(device, main.ptr, self.last_side)] = (device, main, side)
        self._keep.append(reads)
        return side

    def made(self, *arrays):
        """Record arrays that side work wrote (weight and bias gradients): an update that
        takes the split updates their leaves on the side stream."""
        self._made += [(a.data.ptr, a.data.ptr + a.nbytes) for a in arrays if a is not None]

    def main_read(self):
        """Record the current (main) stream's position after an op that read params (an
        input gradient, or a layer's whole backward where the backend cannot see its reads):
        an early update waits for it."""
        if self._update_early:
            self._reads.append(_libcuda.capture_deps(cupy.cuda.get_current_stream().ptr))

    def join(self):
        """Every forked-from stream waits for its side streams (each one tried, the first
        error raised after); the kept inputs are let go once all have been joined."""
        error = None
        mains = {}
        for device, main, side in self._forks.values():
            mains.setdefault((device, main.ptr), (device, main, []))[2].append(side)
        one = len(mains) == 1 and self._update_early and self._made
        for device, main, sides in mains.values():
            try:
                with cupy.cuda.Device(device):
                    before = _libcuda.capture_deps(main.ptr) if one else None
                    for side in sides:
                        main.wait_event(_event_on(side))
                    info = _libcuda.capture_info(main.ptr) if one else None
                    after = None if info is None else info[1]
                    # captured: every read's position known (else no split)
                    known = before is None or all(r is not None for r in self._reads)
                    if one and (before is None) == (after is None) and known:
                        read = self._reads[-1] if before is not None and self._reads else ()
                        self.split = SplitPoint(main, sides, self._made, before, after, read,
                                                None if info is None else info[0])
            except Exception as e:  # noqa: BLE001 - join the others, then raise it
                error = error or e
                self.split = None
        self._forks.clear()
        if error is not None:
            raise error  # the inputs stay kept: a stream that did not join may still read
        self._keep.clear()


class SplitPoint:
    """Where a scope joined its side streams, for the optimizer update that follows.

    ``ready()`` says whether the update may split there: its leaves whose gradients the
    side streams made (``early``) are then updated on the first side stream (``side``),
    after all of them, the others on the main stream, and ``rejoin`` makes the main stream
    wait for both. While a graph is captured, the join is first taken back (``release``:
    the main stream's next node depends again on its own work only), so the side's update
    runs beside the main stream's last work; that needs the main stream to have issued
    nothing since the join. Outside a capture the side stream first waits for the main
    stream (nothing overlaps; the warm-up of a compiled step builds the same kernels this
    way).
    """

    def __init__(self, main, sides, made, before, after, read=(), capture=None):
        self.main, self.sides, self.side, self._made = main, tuple(sides), sides[0], tuple(made)
        self._before, self._after, self._read = before, after, tuple(read)
        self._capture = capture  # the capture sequence's id (node handles are per graph)

    def ready(self) -> bool:
        if cupy.cuda.get_current_stream().ptr != self.main.ptr:
            return False
        if self._after is None:  # not captured: ordered by events instead
            return _libcuda.capture_deps(self.main.ptr) is None
        return self._capture is not None and \
            _libcuda.capture_info(self.main.ptr) == (self._capture, self._after)

    def early(self, array) -> bool:
        """Whether side work wrote ``array``'s memory (the gradient of an early leaf)."""
        start = array.data.ptr
        end = start + array.nbytes
        return any(a <= start and end <= b for a, b in self._made)

    def release(self) -> bool:
        """Before the side stream's update: make it wait for every side stream and for the
        main stream's last read of params, and take the captured join back; not captured
        (or where the driver does not take the new dependencies), the side stream waits for
        all the main stream's work instead (which joined every side stream). Whether the
        two launches may overlap the main stream's last work (the captured path)."""
        if self._after is None:
            self.side.wait_event(_event_on(self.main))
            return False
        deps = [_libcuda.capture_deps(s.ptr) for s in self.sides]
        if any(d is None for d in deps) or not _libcuda.set_capture_deps(
                self.side.ptr, tuple(dict.fromkeys(sum(deps, ()) + self._read))):
            self.side.wait_event(_event_on(self.main))  # still joined: after everything
            return False
        # else the main stream stays joined: correct, without the overlap
        return _libcuda.set_capture_deps(self.main.ptr, self._before)

    def rejoin(self):
        for side in self.sides:
            self.main.wait_event(_event_on(side))
