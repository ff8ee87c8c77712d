"""The backend's 3xTF32 ``wgmma`` kernel per operand split, at the medium model's products.

    python benchmarks/wgmma_splits.py --out DIR [--seeds 3]

For each of 784-1024-1024-10's five products at batch 256, laid out as the backend lays
them (``_cuda_wgmma.layout`` of the same views), and for each split in
``_cuda_wgmma.SPLITS``: the norm-relative error of the product (its K slices added in
float32 in order, as many slices as the backend would use, as its epilog pass does) against the float64 product, over
fresh normal operands per seed, and the time per product (``orientation_probe.span_us``:
median of 7 blocks of 20 launches, CUDA events). cuBLAS's float32 (``cupy.matmul``
without TF32) is timed and checked beside them. Why: the splits trade accuracy for split
instructions, and whether one is both float32-accurate and fast decides the default.
JSON out: ``wgmma_splits.json``.
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
from orientation_probe import span_us  # noqa: E402

os.environ.setdefault("CUPY_TF32", "0")


def products(cp, rng, batch=256, sizes=(784, 1024, 1024)):
    """The five products of the medium model's step as (name, a, b) device views, a @ b."""
    x = cp.asarray(rng.standard_normal((batch, sizes[0]), dtype=np.float32))
    h = cp.asarray(rng.standard_normal((batch, sizes[1]), dtype=np.float32))
    w1 = cp.asarray(rng.standard_normal((sizes[1], sizes[0]), dtype=np.float32))
    w2 = cp.asarray(rng.standard_normal((sizes[2], sizes[1]), dtype=np.float32))
    dy = cp.asarray(rng.standard_normal((batch, sizes[2]), dtype=np.float32))
    dh = cp.asarray(rng.standard_normal((batch, sizes[1]), dtype=np.float32))
    return [("layer 1 forward", x, w1.T), ("layer 2 forward", h, w2.T),
            ("layer 2 weight gradient", dy.T, h), ("layer 2 input gradient", dy, w2),
            ("layer 1 weight gradient", dh.T, x)]


def rel_err(got, ref):
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    import cupy as cp

    from fuseflow.backend import _cuda_wgmma as W

    if not W.available():
        raise SystemExit("wgmma_splits: needs a GPU of compute capability 9.0 (H100, H200)")
    arms = ["cublas_fp32", *sorted(W.SPLITS)]
    rows = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        for name, a, b in products(cp, rng):
            lay = W.layout(a, b)
            if lay is None or not W.supported(*lay, a, b):
                raise SystemExit(f"wgmma_splits: the kernel does not take {name}")
            m, n, k, a_kmajor, lda, b_kmajor, ldb = lay
            slices = W.slices_for(m, n, k)
            ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
            for arm in arms:
                if arm == "cublas_fp32":
                    def run():
                        return cp.matmul(a, b)
                else:
                    out = cp.empty((slices, m, n), dtype=np.float32)

                    def run(arm=arm, out=out):
                        W.product(a, b, out, m, n, k, lda, ldb, a_kmajor=a_kmajor,
                                  b_kmajor=b_kmajor, slices=slices, split=arm)
                        return out
                got = cp.asnumpy(run())
                if arm != "cublas_fp32":  # the slices added in float32, in order, as the
                    got = functools.reduce(np.add, got)  # backend's epilog pass adds them
                got = got.astype(np.float64)
                row = {"seed": seed, "product": name, "m": m, "n": n, "k": k,
                       "slices": slices, "arm": arm, "rel_err": rel_err(got, ref),
                       "us": span_us(cp, run)}
                rows.append(row)
                print(row, flush=True)
    summary = {}
    for name in dict.fromkeys(r["product"] for r in rows):
        summary[name] = {arm: {"rel_err_max": max(r["rel_err"] for r in rows
                                                  if r["product"] == name and r["arm"] == arm),
                               "us_median": statistics.median(
                                   r["us"] for r in rows
                                   if r["product"] == name and r["arm"] == arm)}
                         for arm in arms}
    total = {arm: sum(s[arm]["us_median"] for s in summary.values()) for arm in arms}
    print({"us_five": total}, flush=True)
    write_json(os.path.join(args.out, "wgmma_splits.json"),
               {"benchmark": "wgmma_splits", **metadata("cupy"), "rows": rows,
                "summary": summary, "us_five": total})


if __name__ == "__main__":
    main()
