"""Pick a cuBLASLt algorithm by timing the candidates, as XLA's autotuner does.

cuBLASLt's heuristic ranks algorithms without running them; for full-fp32 matmuls with a
small batch it picks split-K kernels that add a reduction launch and then run the epilog
(bias, ReLU mask, bias gradient) as yet another kernel. Timing each candidate on the real
operands finds the fastest. Small matmuls take a few microseconds, less than the host needs
to enqueue one nvmath call, so a candidate is timed as a CUDA graph of several executions,
replayed between two events: the time is the GPU's alone.

Timing allocates from CuPy's default pool on a stream of its own, so a compiled step's
private memory pool keeps only what the step itself needs.
"""

from __future__ import annotations

import statistics

import cupy
import numpy as np

from fuseflow.backend._env import env_int

#: No matmul of more multiply-adds is tuned (every one by default;
#: ``FUSEFLOW_AUTOTUNE_MAX_MACS`` bounds the seconds spent timing huge ones).
MAX_MACS = env_int("FUSEFLOW_AUTOTUNE_MAX_MACS", 2 ** 62)
#: ``autotune="auto"`` tunes float32 matmuls from this many multiply-adds on: on the H200
#: the heuristic's picks for 784-4096-4096-10 at batch 8192 cost 1% of the step (fp32) and
#: 4% (TF32), while float16 picks were already the fastest and the medium model's (under
#: 2^32) measured no faster inside the step when tuned.
AUTO_MIN_MACS = 2 ** 32
LIMIT = 32          # candidates asked of the heuristic
_TARGET_US = 200.0  # GPU time aimed at per timed graph


def wanted(mode, macs: int, dtype) -> bool:
    """Whether a matmul of ``macs`` multiply-adds in ``dtype`` is tuned under ``mode``
    (the backend's ``autotune``: True, False or "auto")."""
    if macs > MAX_MACS:
        return False
    if mode == "auto":
        return np.dtype(dtype) == np.float32 and macs >= AUTO_MIN_MACS
    return mode is True


def graph_time_us(fn, reps: int, replays: int = 3) -> float:
    """Median GPU microseconds of one ``fn()``, from replays of a graph of ``reps`` calls."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc), stream:
        for _ in range(reps):  # warm-up: workspace, pool blocks for the capture
            fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(reps):
                fn()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(replays):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / reps)
    return statistics.median(times)


def fastest(mm, algorithms):
    """``(algorithm, timings_us)``: the fastest of ``algorithms`` for the planned nvmath
    ``Matmul`` ``mm`` (operands already bound). Candidates that fail to run are skipped."""
    first = graph_time_us(lambda: mm.execute(algorithm=algorithms[0]), reps=1, replays=1)
    reps = max(1, min(10, int(_TARGET_US / max(first, 1e-3))))
    timings = []
    for alg in algorithms:
        try:
            us = graph_time_us(lambda alg=alg: mm.execute(algorithm=alg), reps)
        except Exception:  # noqa: BLE001 - an algorithm that cannot run is not a candidate
            us = float("inf")
        timings.append(us)
    best = min(range(len(algorithms)), key=timings.__getitem__)
    # nvmath records its last compute event on the timing stream inside a capture: run once
    # eagerly so that the plan's bookkeeping points at a real event again.
    mm.execute(algorithm=algorithms[best])
    cupy.cuda.get_current_stream().synchronize()
    return algorithms[best], timings
