"""The large model's first-layer forward in float16, by epilog and by K, timed on the GPU.

    python benchmarks/l1_epilog_sweep.py --out DIR [--limit 32]

In the profiled 16-bit step, layer 1's forward (8192 x 784 @ 784 x 4096 with cuBLASLt's
RELU_AUX_BIAS epilog) runs at about 490 TFLOP/s where the step's other large matmuls run at
760-910. This times, for K = 768, 784, 800 and 832 and each epilog (none, BIAS, RELU_BIAS,
RELU_AUX_BIAS), the heuristic's first algorithm and the fastest of up to ``--limit``
candidates (CUDA-graph replays, ``fuseflow.backend._cuda_autotune``), to tell whether the
loss is the K = 784 tail, the epilog, or the mask output. JSON out.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402

EPILOGS = (None, "BIAS", "RELU_BIAS", "RELU_AUX_BIAS")


def time_variant(cp, m, k, n, epilog, limit):
    from nvmath.linalg import ComputeType
    from nvmath.linalg.advanced import Matmul, MatmulEpilog

    from fuseflow.backend._cuda_autotune import fastest

    rng = cp.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
    # the batch row-major (n, k), read transposed: the backend's y^T = W @ x^T
    b = (rng.standard_normal((n, k), dtype=cp.float32) / k ** 0.5).astype(cp.float16).T
    inputs = {"bias": rng.standard_normal(m, dtype=cp.float32).astype(cp.float16)} \
        if epilog else None
    mm = Matmul(a, b, options={"compute_type": ComputeType.COMPUTE_32F})
    algs = mm.plan(preferences={"limit": limit},
                   epilog=None if epilog is None else MatmulEpilog[epilog], epilog_inputs=inputs)
    _, timings = fastest(mm, algs)
    mm.free()
    ok = [t for t in timings if t != float("inf")]
    flops = 2.0 * m * k * n
    best = min(ok)
    return {"m": m, "k": k, "n": n, "epilog": epilog or "NONE", "n_algorithms": len(algs),
            "heuristic_us": round(timings[0], 2), "best_us": round(best, 2),
            "best_rank": timings.index(best),
            "heuristic_tflops": round(flops / timings[0] / 1e6, 1),
            "best_tflops": round(flops / best / 1e6, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--width", type=int, default=4096)
    args = ap.parse_args()
    import cupy as cp

    rows = []
    for k in (768, 784, 800, 832):
        for ep in EPILOGS:
            # as the backend issues it: y^T (width x batch) = W (width x K) @ x^T
            row = time_variant(cp, args.width, k, args.batch, ep, args.limit)
            rows.append(row)
            print(row, flush=True)
    write_json(os.path.join(args.out, "l1_epilog_sweep.json"),
               {"benchmark": "l1_epilog_sweep", **metadata("cupy", "nvmath"),
                "limit": args.limit, "rows": rows})


if __name__ == "__main__":
    main()
