"""Where a matmul's time goes: fixed cost against cost per k-tile, by K.

    python benchmarks/gemm_kscan.py --out DIR

The medium model's layer shape (256 x 1024 outputs, bias, ReLU and mask) at K from 16 to
1024, one block per output tile (no K split), through fuseflow's own kernel (float32 FMAs
and the float64 tensor cores) and the cuBLASLt path, timed like a compiled step runs them
(20 calls in one CUDA graph, median over replays), next to an empty kernel's launch in the
same kind of graph. A straight line through time against K splits each form into what one
k-tile costs and what every launch pays whatever K is. JSON out.
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
from gemm_sweep import cublaslt_fp32  # noqa: E402
from skinny_sweep import graph_us  # noqa: E402

KS = (16, 32, 64, 128, 256, 512, 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--n", type=int, default=1024)
    args = ap.parse_args()
    import cupy as cp

    from fuseflow.backend import _cuda_gemm as G
    from fuseflow.backend.epilogs import relu_aux_rows

    cublas = cublaslt_fp32()
    empty = cp.RawKernel('extern "C" __global__ void empty() {}', "empty")
    rng = cp.random.default_rng(0)
    m, n = args.m, args.n
    b = rng.standard_normal(n, dtype=np.float32)
    rows = [{"form": "empty kernel", "us": graph_us(lambda: empty((1,), (32,), ()))}]
    forms = {"own simt, 1 split": dict(mma="simt", splits=1),
             "own f64, 1 split": dict(mma="f64", splits=1),
             "own f64, 4 splits": dict(mma="f64", splits=4)}
    for k in KS:
        x = cp.maximum(rng.standard_normal((m, k), dtype=np.float32), 0)
        w = rng.standard_normal((n, k), dtype=np.float32) / float(np.sqrt(k))
        for name, launch in forms.items():
            if launch["splits"] * G.BK > k:
                continue
            us = graph_us(lambda: G.forward(x, w, b, relu=True, aux_rows=relu_aux_rows(n),
                                            **launch))
            rows.append({"form": name, "k": k, "us": us})
        rows.append({"form": "cublaslt path", "k": k,
                     "us": graph_us(lambda: cublas.linear(x, w, b, "RELU_AUX_BIAS"))})
    fits = {}
    for name in [*forms, "cublaslt path"]:
        pts = [(r["k"], r["us"]) for r in rows if r["form"] == name and r["k"] >= 64]
        slope, icept = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)
        fits[name] = {"us_per_k_tile": float(slope * G.BK), "us_fixed": float(icept)}
    for r in rows:
        print(f"{r['form']:22s} k={r.get('k', '-')!s:5s} {r['us']:8.2f} us", flush=True)
    for name, f in fits.items():
        print(f"{name:22s} fixed {f['us_fixed']:6.2f} us, per k-tile of {G.BK} "
              f"{f['us_per_k_tile']:6.3f} us", flush=True)
    write_json(os.path.join(args.out, "gemm_kscan.json"),
               {"benchmark": "gemm_kscan", **metadata("cupy", "nvmath"), "m": m, "n": n,
                "rows": rows, "fits_k_ge_64": fits,
                "note": "median GPU time per call: 20 calls in one CUDA graph"})


if __name__ == "__main__":
    main()
