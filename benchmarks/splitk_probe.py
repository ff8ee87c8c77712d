"""K split by fuseflow (one strided-batched cuBLASLt matmul + the epilog adding the slices)
against cuBLASLt's own split-K (its matmul kernel + its reduction kernel + the epilog pass).

    python benchmarks/splitk_probe.py --out DIR [--rounds 3]

Part 1, per matmul of the medium model (784-1024-1024-10, batch 256, full float32): layer
1's and layer 2's forwards (bias, ReLU, mask) and layer 2's input gradient (DRELU + bias
gradient), through ``CudaBackend`` with ``k_splits`` 0 (cuBLASLt's split-K, the default)
and each even split of K, timed like a compiled step runs them (20 calls in one CUDA graph,
median over replays), with the batched matmul alone beside it and the largest difference
from the unsplit result. Part 2: the compiled medium SGD and Adam steps with each
``k_splits``, alternating over rounds, a step's median time over blocks of calls. JSON out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from gemm_sweep import cublaslt_fp32  # noqa: E402
from peers import compiled_step_us  # noqa: E402
from skinny_sweep import graph_us  # noqa: E402

SPLITS = {784: (2, 4, 7, 14), 1024: (2, 4, 8, 16), 512: (2, 4, 8)}
CASES = [  # (label, batch, K, features)
    ("784-1024-1024-10 layer 1 forward", 256, 784, 1024),
    ("784-1024-1024-10 layer 2 forward", 256, 1024, 1024),
    ("784-1024-1024-10 layer 2 input gradient", 256, 1024, 1024),
    ("784-1024-1024-10 batch 512 layer 2 forward", 512, 1024, 1024),
    ("784-512-512-10 (the CLI's) eval batch 1000 layer 1 forward", 1000, 784, 512),
    ("784-512-512-10 (the CLI's) eval batch 1000 layer 2 forward", 1000, 512, 512),
]


def matmul_rows(cp, be, autotune):
    from fuseflow.backend.epilogs import relu_aux_rows

    rng = cp.random.default_rng(0)
    rows = []
    be.autotune = autotune
    for label, batch, k, feat in CASES:
        x = cp.maximum(rng.standard_normal((batch, k), dtype=np.float32), 0)
        w = rng.standard_normal((feat, k), dtype=np.float32) / float(np.sqrt(k))
        b = rng.standard_normal(feat, dtype=np.float32)
        if label.endswith("gradient"):
            # layer 2's input gradient: dy (batch, k) @ w2 (k, feat), layer 1's mask
            w = w.T.copy()
            _, aux = be.linear(rng.standard_normal((batch, 784), dtype=np.float32),
                               rng.standard_normal((feat, 784), dtype=np.float32),
                               b, "RELU_AUX_BIAS")
            assert aux.shape == (relu_aux_rows(feat), batch)

            def op(x=x, w=w, aux=aux):
                return be.linear_dgrad(x, w, "DRELU_BGRAD", aux)
        else:
            def op(x=x, w=w, b=b):
                return be.linear(x, w, b, "RELU_AUX_BIAS")
        stage = "dgrad" if label.endswith("gradient") else "forward"
        ref = None
        for s in (0, "auto", *SPLITS[k]):
            be.k_splits = s
            out = op()
            y = cp.asnumpy(out[0]).astype(np.float64)
            extra = cp.asnumpy(out[1])   # relu_aux bytes, or the bias gradient
            if ref is None:
                ref = (y, extra)
            err = float(np.abs(y - ref[0]).max() / np.abs(ref[0]).max())
            err2 = float((extra != ref[1]).sum()) if extra.dtype == np.uint8 else \
                float(np.abs(extra - ref[1]).max() / max(np.abs(ref[1]).max(), 1e-30))
            calls = be.stats()["k_split"]
            us = round(graph_us(op), 2)
            row = {"matmul": label, "k_splits": s, "autotune": autotune,
                   "k_split_calls": be.stats()["k_split"] - calls,
                   "us": us, "max_rel_diff": err, "second_output_diff": err2}
            if row["k_split_calls"]:
                a, bm = (x, w.T) if stage == "forward" else (x, w)
                row["batched_matmul_us"] = round(graph_us(lambda: be._split_k(stage, a, bm)), 2)
            rows.append(row)
            print(row, flush=True)
    return rows


def step_rows(cp, ff, be, splits, rounds):
    rows = []
    for r in range(rounds):
        for opt in ("sgd", "adam"):
            for s in splits:
                be.k_splits = s
                us, loss = compiled_step_us(ff, cp, "784-1024-1024-10", opt)
                row = {"round": r + 1, "optimizer": opt, "k_splits": s, "step_us": round(us, 2),
                       "loss": loss, "k_split_calls": be.stats()["k_split"]}
                rows.append(row)
                print(row, flush=True)
    be.k_splits = "auto"
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-splits", default="0,auto,4",
                    help="k_splits values of the compiled steps (an invalid split of a "
                         "layer's K leaves that layer unsplit)")
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff

    payload = {**metadata("cupy", "nvmath", "fuseflow"), "benchmark": "splitk_probe"}
    # backends of their own: graph_us captures plans outside ff.compile's recording, and
    # those must not be re-planned (freed) by a later autotune mode
    payload["matmuls"] = matmul_rows(cp, cublaslt_fp32(), False) + \
        matmul_rows(cp, cublaslt_fp32(), True)
    write_json(Path(args.out) / "splitk_probe.json", payload)
    be = ff.backend.get("cuda")
    be.tf32 = False
    be.fp32_wgmma = "off"  # k_splits must set cuBLASLt's K split, not the kernel's slices
    splits = [s if s == "auto" else int(s) for s in args.step_splits.split(",")]
    payload["steps"] = step_rows(cp, ff, be, splits, args.rounds)
    write_json(Path(args.out) / "splitk_probe.json", payload)


if __name__ == "__main__":
    main()
