"""fuseflow's own float32 matmul (``_cuda_gemm``) against the cuBLASLt path, per layer.

    python benchmarks/gemm_sweep.py --out DIR

For each dense matmul of 784-1024-1024-10 at batch 256 (and forward layers at longer
batches, to place ``DEFAULT_MAX_MACS``), in full float32: the backend op as it runs today
with the own matmul off (cuBLASLt's SIMT kernel, its split-K reduction, fuseflow's epilog
pass) and on, plus the own kernel at other tile shapes and K splits. Timed like a compiled
step runs them: 20 calls in one CUDA graph, median over replays (``skinny_sweep.graph_us``).
JSON out.
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
from skinny_sweep import graph_us  # noqa: E402

# (label, op, batch, inputs, outputs): the layer's x (batch, inputs), w (outputs, inputs)
LAYERS = [
    ("784-1024-1024-10 layer 1 forward", "forward", 256, 784, 1024),
    ("784-1024-1024-10 layer 2 forward", "forward", 256, 1024, 1024),
    ("784-1024-1024-10 layer 2 wgrad", "wgrad", 256, 1024, 1024),
    ("784-1024-1024-10 layer 2 dgrad (DRELU_BGRAD)", "dgrad", 256, 1024, 1024),
    ("784-1024-1024-10 layer 1 wgrad", "wgrad", 256, 784, 1024),
    ("1024 -> 1024 forward, batch 1024", "forward", 1024, 1024, 1024),
    ("1024 -> 1024 forward, batch 4096", "forward", 4096, 1024, 1024),
    ("784 -> 4096 forward, batch 8192", "forward", 8192, 784, 4096),
]


def int_list(text):
    return [int(v) for v in text.split(",")]


def warps_list(text):
    return [tuple(int(v) for v in w.split("x")) for w in text.split(",")]


def cublaslt_fp32():
    """A CudaBackend whose full-float32 products are cuBLASLt's: the own matmul and the
    3xTF32 ``wgmma`` kernel (the default on compute capability 9.0) off, no autotuning.
    The reference the probes here check and time against."""
    from fuseflow.backend.cuda_backend import CudaBackend

    be = CudaBackend(tf32=False, autotune=False)
    be.own_gemm_max_macs = 0
    be.fp32_wgmma = "off"
    return be


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--warps", type=warps_list, default="2x2,1x2,4x2",
                    help="own-kernel launch shapes swept, warps along M x N (default %(default)s)")
    ap.add_argument("--splits", type=int_list, default="1,2,4,8",
                    help="K splits swept (default %(default)s)")
    ap.add_argument("--bk", type=int_list, default="8,16",
                    help="k-tile depths swept (default %(default)s)")
    ap.add_argument("--layers", type=int, default=len(LAYERS),
                    help="sweep only the first N shapes (default: all %(default)s)")
    ap.add_argument("--cluster", choices=("off", "on", "both"), default="off",
                    help="K splits added by the last block (off), in a thread-block cluster "
                         "(on), or both (default %(default)s)")
    ap.add_argument("--mma", default="simt",
                    help="inner products swept, of _cuda_gemm.MMAS (default %(default)s)")
    ap.add_argument("--dmma-k", type=int_list, default="16",
                    help="k of the float64 tensor cores' m16n8k* shape swept, with --mma f64 "
                         "(default %(default)s)")
    ap.add_argument("--name", default="gemm_sweep", help="JSON file name (without .json)")
    args = ap.parse_args()
    clusters = {"off": (False,), "on": (True,), "both": (False, True)}[args.cluster]
    variants = [(w, sp, bk, cl, mma, dk) for w in args.warps for sp in args.splits
                for bk in args.bk for cl in clusters for mma in args.mma.split(",")
                for dk in (args.dmma_k if mma == "f64" else [None])]
    import cupy as cp

    from fuseflow.backend import _cuda_gemm as G
    from fuseflow.backend.cuda_backend import CudaBackend

    own = CudaBackend(tf32=False, autotune=False)
    own.own_gemm_max_macs = 2 ** 62  # opt-in, at every size swept
    cublas = cublaslt_fp32()
    rng = cp.random.default_rng(0)
    rows = []
    for label, op, batch, fin, fout in LAYERS[:args.layers]:
        x = cp.maximum(rng.standard_normal((batch, fin), dtype=np.float32), 0)
        w = rng.standard_normal((fout, fin), dtype=np.float32) / float(np.sqrt(fin))
        b = rng.standard_normal(fout, dtype=np.float32)
        dy = rng.standard_normal((batch, fout), dtype=np.float32)
        _, aux = own.linear(x, w, b, "RELU_AUX_BIAS") if op == "dgrad" else (None, None)
        wl = rng.standard_normal((fin, fout), dtype=np.float32) / float(np.sqrt(fout))
        if op == "forward":
            def backend_op(be):
                return lambda: be.linear(x, w, b, "RELU_AUX_BIAS")
            def kernel(**launch):
                return lambda: G.forward(x, w, b, relu=True, aux_rows=aux_rows, **launch)
            from fuseflow.backend.epilogs import relu_aux_rows
            aux_rows = relu_aux_rows(fout)
            m, n, k = batch, fout, fin
        elif op == "dgrad":
            dyl = rng.standard_normal((batch, fin), dtype=np.float32)  # the layer above's dpre
            def backend_op(be):
                return lambda: be.linear_dgrad(dyl, wl, "DRELU_BGRAD", aux)
            def kernel(**launch):
                return lambda: G.dgrad(dyl, wl, aux, aux.shape[0], bgrad=True, **launch)
            m, n, k = batch, fout, fin
        else:
            def backend_op(be):
                return lambda: be.linear_wgrad(dy, x, "DEFAULT")
            def kernel(**launch):
                return lambda: G.wgrad(dy, x, **launch)
            m, n, k = fout, fin, batch
        flops = 2.0 * m * n * k
        row = {"label": label, "op": op, "m": m, "n": n, "k": k,
               "default_launch": {"warps": list(G.WARPS),
                                  "splits": G.splits_for(m, n, k)[0]}}
        row["cublaslt_path_us"] = graph_us(backend_op(cublas))
        row["own_default_us"] = graph_us(backend_op(own))
        row["variants"] = []
        for warps, splits, bk, cluster, mma, dmma_k in variants:
            if m * n * k > 2 ** 31 and (warps, splits) != (G.WARPS, 1):
                continue  # the long batches: the default tile only
            if cluster and (splits == 1 or not G.cluster_fits(warps, splits)):
                continue
            if mma == "f64" and (not G.tile_fits(warps) or bk % dmma_k):
                continue
            v = {"warps": list(warps), "splits": splits, "bk": bk, "cluster": cluster,
                 "mma": mma, "dmma_k": dmma_k}
            try:
                us = graph_us(kernel(warps=warps, splits=splits, bk=bk, cluster=cluster,
                                     mma=mma, dmma_k=dmma_k))
            except Exception as e:  # noqa: BLE001 - record and go on
                row["variants"].append({**v, "error": str(e)[:200]})
                continue
            row["variants"].append({**v, "us": us, "tflops": flops / us / 1e6})
        best = min((v for v in row["variants"] if "us" in v), key=lambda v: v["us"])
        row["best_variant"] = best
        row["speedup_default_vs_cublaslt"] = row["cublaslt_path_us"] / row["own_default_us"]
        print(f"{label:48s} cublaslt {row['cublaslt_path_us']:8.2f}  own {row['own_default_us']:8.2f}"
              f"  best {best['us']:8.2f} {best['warps']} s={best['splits']} bk={best['bk']}"
              f" cluster={best['cluster']} mma={best['mma']} dmma_k={best['dmma_k']}",
              flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, f"{args.name}.json"),
               {"benchmark": "gemm_sweep", **metadata("cupy", "nvmath"), "rows": rows,
                "note": "median GPU time per call: 20 calls in one CUDA graph; "
                        "cublaslt_path_us = the backend op with own_gemm_max_macs = 0"})


if __name__ == "__main__":
    main()
