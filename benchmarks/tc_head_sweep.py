"""The one-pass output layer (``_cuda_tc_head``) against its two kernels, alone on the GPU.

    python benchmarks/tc_head_sweep.py --out DIR [--clusters 8,12,16,24] [--tiles 32x3,32x4]
        [--forms whole,split,roles]

At 784-4096-4096-10's output layer (batch 8192, 4096 features, 10 classes, bfloat16, with
the ReLU mask and both bias gradients): ``_cuda_skinny_tc.forward_xent`` followed by
``grads`` (today's path, two launches plus the partials' sums) and ``_cuda_tc_head.
forward_grads`` in its default form at each cluster count (the grid's row chunks), then
each form of ``--forms`` at each tile shape (rows per tile x tiles in flight, ``TR`` x
``STAGES``): "whole" (one cluster barrier a tile), "split" (``SPLIT_BARRIER``), "roles"
(``ROLES``, the default). ``--ncu`` profiles one call of the first form. Each variant is
captured in a CUDA graph of 20 calls and replayed; the median over 7 replays, in us per
call, with the bandwidth that x read once and dx written once would need. JSON out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="")
    ap.add_argument("--clusters", default="7,12,13,14,15,16,28")
    ap.add_argument("--tiles", default="32x3,32x4,16x3",
                    help="rows per tile x stages, each timed at the default cluster count")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--forms", default="roles",
                    help="the kernel's forms timed at each tile shape: whole, split, roles")
    ap.add_argument("--ncu", action="store_true",
                    help="for Nsight Compute (--profile-from-start off): one call of the "
                         "one-pass kernel between cudaProfilerStart and Stop, nothing timed")
    args = ap.parse_args()

    import cupy as cp
    import ml_dtypes
    import numpy as np

    from fuseflow.backend import _cuda_skinny_tc as TC
    from fuseflow.backend._cuda_autotune import graph_time_us
    from fuseflow.backend import _cuda_tc_head as HD
    from fuseflow.backend.cuda_backend import CudaBackend

    rng = np.random.default_rng(0)
    b16 = ml_dtypes.bfloat16
    batch, features, n = args.batch, args.features, args.classes
    pre = cp.asarray(rng.standard_normal((batch, features)).astype(b16))
    h, aux = CudaBackend(tf32=False).activation(pre, "relu")
    aux = cp.asfortranarray(aux)
    w = cp.asarray((rng.standard_normal((n, features)) / np.sqrt(features)).astype(b16))
    b = cp.asarray(rng.standard_normal(n).astype(b16))
    labels = cp.asarray(rng.integers(0, n, batch))
    ld = aux.shape[0]

    def two():
        _, _, dy = TC.forward_xent(h, w, b, labels, None)
        TC.grads(dy, h, w, aux, ld, bgrad_w=True, bgrad_x=True)

    chosen = args.forms.split(",")
    if any(f not in HD.FORMS for f in chosen):
        raise SystemExit(f"--forms: each one of {list(HD.FORMS)}, got {args.forms!r}")
    if args.ncu:
        HD.ROLES, HD.SPLIT_BARRIER = HD.FORMS[chosen[0]]
        for _ in range(3):  # compiled and warm
            HD.forward_grads(h, w, b, labels, None, aux, ld, bgrad_w=True, bgrad_x=True)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.start()
        HD.forward_grads(h, w, b, labels, None, aux, ld, bgrad_w=True, bgrad_x=True)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.stop()
        return
    def graph_us(fn):  # us per call: 20 calls in a CUDA graph, the median of 7 replays
        return graph_time_us(fn, reps=20, replays=7)

    rows = [{"variant": "forward_xent + grads", "us": graph_us(two)}]
    def one(c=None):
        HD.forward_grads(h, w, b, labels, None, aux, ld, bgrad_w=True, bgrad_x=True,
                         n_clusters=c)

    default = (HD.TR, HD.STAGES, HD.ROLES, HD.SPLIT_BARRIER)
    form = HD.form()
    for c in [int(v) for v in args.clusters.split(",")]:
        rows.append({"variant": f"tc_head {form}, {c} clusters", "form": form, "clusters": c,
                     "tr": HD.TR, "stages": HD.STAGES, "us": graph_us(lambda c=c: one(c))})
    for form in chosen:
        HD.ROLES, HD.SPLIT_BARRIER = HD.FORMS[form]
        for tile in args.tiles.split(","):
            HD.TR, HD.STAGES = (int(v) for v in tile.split("x"))
            rows.append({"variant": f"tc_head {form}, {HD.TR}x{HD.STAGES}", "form": form,
                         "clusters": HD.CLUSTERS, "tr": HD.TR, "stages": HD.STAGES,
                         "us": graph_us(one)})
    HD.TR, HD.STAGES, HD.ROLES, HD.SPLIT_BARRIER = default
    moved = 2 * batch * features * h.itemsize + aux.nbytes  # x once, dx once, the mask
    for r in rows:
        r["tb_per_s_at_one_pass"] = moved / r["us"] / 1e6
        print(f"{r['variant']:>28}: {r['us']:8.2f} us  "
              f"({r['tb_per_s_at_one_pass']:.2f} TB/s for x and dx once)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"tc_head_sweep{'_' + args.tag if args.tag else ''}.json",
               {"benchmark": "tc_head_sweep", **metadata("cupy"), "batch": batch,
                "features": features, "classes": n, "dtype": "bfloat16", "rows": rows})


if __name__ == "__main__":
    main()
