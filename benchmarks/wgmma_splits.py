"""The backend's 3xTF32 ``wgmma`` kernel per operand split, at the medium model's products.

    python benchmarks/wgmma_splits.py --out DIR [--seeds 3]

For each of 784-1024-1024-10's five products at batch 256 (``gemm_sweep.LAYERS[:5]``, with
the operands, float64 product and error measures of ``tf32x3_pipe_probe.Case``, as
``wgmma_probe.py`` has them) and for each split in ``_cuda_wgmma.SPLITS``: the error of
the product against the float64 one (its K slices, as many as the backend would use,
added in float32 in order, as the backend's epilog pass adds them), over fresh operands
per seed, and the kernel's time (``skinny_sweep.graph_us``: 20 calls in one CUDA graph). cuBLASLt's
float32 and TF32 products are checked and timed beside them (``Case.baseline``). Why: the
splits trade accuracy for split instructions, and whether one is both float32-accurate
and fast decides the default. JSON out: ``wgmma_splits.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from gemm_sweep import LAYERS  # noqa: E402
from tf32x3_pipe_probe import Case, backends, errors  # noqa: E402


def split_variant(W, c, split, graph_us):
    """Case ``c``'s product by the kernel with ``split``: its slice count, its errors (the
    K slices added in float32 in order) and the time of the kernel alone."""
    import cupy as cp

    slices = W.slices_for(c.m, c.n, c.k)
    out = cp.empty((slices, c.m, c.n), dtype=np.float32)
    run = functools.partial(W.product, c.A, c.B, out, c.m, c.n, c.k, c.lda, c.ldb,
                            a_kmajor=c.akm, b_kmajor=c.bkm, slices=slices, split=split)
    run()
    got = functools.reduce(np.add, cp.asnumpy(out))
    return {"split": split, "slices": slices, "errors": errors(got, c.ref, c.scale),
            "us": graph_us(run)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    from fuseflow.backend import _cuda_wgmma as W

    if not W.available():
        raise SystemExit("wgmma_splits: needs a GPU of compute capability 9.0 (H100, H200)")
    from skinny_sweep import graph_us

    fp32, tf32 = backends()
    rows = []
    by_arm = {}  # label -> arm -> [(us, norm_rel) per seed]
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        for layer in LAYERS[:5]:
            c = Case(*layer, rng)
            row = {"seed": seed, **c.baseline(fp32, tf32, graph_us)}
            row["variants"] = [split_variant(W, c, split, graph_us)
                               for split in sorted(W.SPLITS)]
            rows.append(row)
            arms = {f"cublaslt_{p}": (row[f"cublaslt_{p}_us"],
                                      row[f"cublaslt_{p}_errors"]["norm_rel"])
                    for p in ("fp32", "tf32")}
            arms.update((v["split"], (v["us"], v["errors"]["norm_rel"])) for v in row["variants"])
            for arm, measured in arms.items():
                by_arm.setdefault(c.label, {}).setdefault(arm, []).append(measured)
            print({"seed": seed, "label": c.label, **arms}, flush=True)
    summary = {label: {arm: {"us_median": statistics.median(us for us, _ in seeds),
                             "norm_rel_max": max(err for _, err in seeds)}
                       for arm, seeds in arms.items()}
               for label, arms in by_arm.items()}
    total = {arm: sum(s[arm]["us_median"] for s in summary.values())
             for arm in next(iter(summary.values()))}
    print({"us_five": total}, flush=True)
    write_json(os.path.join(args.out, "wgmma_splits.json"),
               {"benchmark": "wgmma_splits", **metadata("cupy", "nvmath"), "rows": rows,
                "summary": summary, "us_five": total,
                "note": "median GPU time per call: 20 calls in one CUDA graph; cublaslt = "
                        "the backend's plain float32 / TF32 product, own matmul off"})


if __name__ == "__main__":
    main()
