"""Can a memory-bound optimizer update hide beside a compute-bound matmul on the same GPU?

    python benchmarks/sm_share_probe.py --out DIR

The 16-bit 784-4096-4096-10 Adam step spends about 190 us (H100) in the fused update, after
its last matmul, and 1,140 us in five cuBLASLt matmuls that leave HBM bandwidth unused
(an 8192 x 4096 x 4096 bf16 product moves about 170 MB in 300 us). Layer 2's update (16.8M
of the 20M params) could run as soon as its weight gradient exists, beside the input
gradient's matmul, if the two did not fight over SMs: cuBLASLt's persistent sm90 kernels
take every SM they are given, and an update launched beside them takes the SMs they need
(the forked weight gradients of call 147 made the step slower).

Here, at that product's shape: the matmul alone at several ``sm_count_target`` values
(cuBLASLt's MATMUL_DESC_SM_COUNT_TARGET, nvmath's ``MatmulOptions.sm_count_target``); the
fused Adam update of a 4096 x 4096 float32 param (bfloat16 gradient and compute copy, the
mixed-precision form) alone at several grid sizes; and the two side by side, the update's
grid capped to the SMs left over, timed as a pair by events: eagerly with the matmul on a
high-priority stream and the update on a low-priority one (matmul launched first, and
update first), eagerly on two streams of equal priority, and those equal-priority pairs
captured in one CUDA graph (the only timing without nvmath's host overhead). The update's
grid cap replaces ``_cuda_fused._launch`` in this process only. JSON out (medians of
``--reps`` timed pairs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402


def priority_range():
    """(least, greatest) stream priority of the current context (CUDA's default range on
    sm90, (0, -5), where the driver call is missing)."""
    import ctypes

    from fuseflow.backend import _libcuda

    fn = _libcuda.entry("cuCtxGetStreamPriorityRange")
    least, greatest = ctypes.c_int(0), ctypes.c_int(-5)
    if fn is not None and fn(ctypes.byref(least), ctypes.byref(greatest)) != 0:
        return 0, -5
    return least.value, greatest.value


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--free-sms", default="0,8,16,24,32",
                    help="SMs left to the update (the matmul's target is the rest; 0: both "
                         "uncapped)")
    args = ap.parse_args()

    import cupy as cp
    from nvmath.linalg.advanced import Matmul, MatmulOptions

    from fuseflow._dtypes import bfloat16
    from fuseflow.backend import _cuda_fused as F

    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    lo, hi = priority_range()
    rng = cp.random.default_rng(0)
    m, k, n = 8192, 4096, 4096
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(bfloat16)
    b = (rng.standard_normal((k, n), dtype=cp.float32) * 0.02).astype(a.dtype)

    # the update's operands: layer 2's param, its gradient, Adam's state, the compute copy
    p = rng.standard_normal((n, k), dtype=cp.float32) * 0.02
    g = (rng.standard_normal((n, k), dtype=cp.float32) * 1e-3).astype(a.dtype)
    mom = rng.standard_normal((n, k), dtype=cp.float32) * 1e-4
    vel = rng.random((n, k), dtype=cp.float32) * 1e-6
    low = p.astype(a.dtype)
    count = cp.zeros((), dtype=cp.int32)
    update_bytes = p.nbytes * 6 + g.nbytes + low.nbytes  # p, m, v read and written

    launch = F._launch

    def update(stream, blocks):
        def capped(kern, quads, kargs):
            grid = max(1, min(-(-quads // 256), blocks)) if blocks else -(-quads // 256)
            kern((grid,), (256,), (np.int64(quads), *kargs))
        F._launch = capped
        try:
            with stream:
                F.multi_tensor_update("adam", [p], [g], [[mom], [vel]], step_const=-1e-3,
                                      count=count, bump_count=True, b1=0.9, b2=0.999,
                                      eps=1e-8, in_place=True, low=[low])
        finally:
            F._launch = launch

    plans = {}

    def gemm(stream, target):
        if target not in plans:
            mm = Matmul(a, b, options=MatmulOptions(sm_count_target=target), stream=stream)
            mm.plan(stream=stream)
            plans[target] = mm
        return plans[target].execute(stream=stream)

    main_hi = cp.cuda.Stream(non_blocking=True, priority=hi)
    side_lo = cp.cuda.Stream(non_blocking=True, priority=lo)
    main_eq = cp.cuda.Stream(non_blocking=True)
    side_eq = cp.cuda.Stream(non_blocking=True)

    def timed(fn, stream):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.reps):
            start.record(stream)
            fn()
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
        return float(np.median(times))

    def pair(main, side, target, blocks, update_first=False):
        def fn():
            fork = cp.cuda.Event()
            fork.record(main)
            side.wait_event(fork)
            if update_first:
                update(side, blocks)
                gemm(main, target)
            else:
                gemm(main, target)
                update(side, blocks)
            join = cp.cuda.Event()
            join.record(side)
            main.wait_event(join)
        return fn

    def graphed(fn, stream):
        for _ in range(2):
            fn()
        stream.synchronize()
        stream.begin_capture()
        fn()
        graph = stream.end_capture()
        return lambda: graph.launch(stream)

    rows = []
    free_list = [int(v) for v in args.free_sms.split(",")]
    gemm_flops = 2.0 * m * n * k
    for free in free_list:
        target = 0 if free == 0 else sms - free
        blocks = 0 if free == 0 else free * 8
        row = {"free_sms": free, "sm_count_target": target, "update_blocks": blocks or None}
        row["gemm_us"] = timed(lambda: gemm(main_eq, target), main_eq)
        row["gemm_tflops"] = gemm_flops / row["gemm_us"] / 1e6
        row["update_us"] = timed(lambda: update(main_eq, blocks), main_eq)
        row["update_tbps"] = update_bytes / row["update_us"] / 1e6
        row["pair_priority_us"] = timed(pair(main_hi, side_lo, target, blocks), main_hi)
        row["pair_equal_us"] = timed(pair(main_eq, side_eq, target, blocks), main_eq)
        row["pair_update_first_us"] = timed(pair(main_hi, side_lo, target, blocks, True),
                                            main_hi)
        try:
            row["pair_graph_us"] = timed(graphed(pair(main_eq, side_eq, target, blocks),
                                                 main_eq), main_eq)
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            row["pair_graph_error"] = repr(e)[:300]
        row["serial_us"] = row["gemm_us"] + row["update_us"]
        print(row, flush=True)
        rows.append(row)
    reference = timed(lambda: (gemm(main_eq, 0), update(main_eq, 0)), main_eq)
    out = {"benchmark": "sm_share_probe", **metadata("cupy", "nvmath"),
           "shape": {"m": m, "k": k, "n": n, "dtype": str(a.dtype)},
           "update_bytes": update_bytes, "sms": sms, "stream_priorities": [lo, hi],
           "serial_uncapped_us": reference, "rows": rows}
    print({"serial_uncapped_us": reference}, flush=True)
    write_json(os.path.join(args.out, "sm_share_probe.json"), out)


if __name__ == "__main__":
    main()
