"""Launch shapes of fuseflow's small-side gradient kernels and mixed-precision updates,
timed the way a compiled step runs them.

    python benchmarks/skinny_sweep.py --out DIR [--only tc]
    python benchmarks/skinny_sweep.py --print-best DIR/skinny_sweep_tc.json

Each variant runs 20 times inside one CUDA graph; the time is the median over replays
divided by 20, so host launch gaps do not count (they do not in a compiled step either).
Swept, in the shapes of the benchmark steps (784-30-10 and 784-1024-1024-10 at batch 256,
784-4096-4096-10 at batch 8192):
- the weight gradient (``_cuda_skinny.wgrad``): rows per chunk (more chunks: more blocks
  and a second pass over per-chunk partials) and outputs per round of its block sums;
- the input gradient with the ReLU mask and bias gradient (``dgrad``): rows per thread;
- both with dy's rows staged through shared memory (the default where they fit) and not,
  at the default launch shape;
- the forward (bias, ReLU, mask) of the short batches: samples per block;
- mixed precision's update of the large model's params: the float32-gradient path
  (unscaling cast, finiteness check, Adam) against the scaled 16-bit path (finiteness
  check and Adam reading the float16 gradients);
- the tensor-core forms (``_cuda_skinny_tc``) of the float16 output layer of
  784-4096-4096-10 at batch 8192 against the SIMT kernels' default launch and (forward)
  cuBLASLt: rows per chunk, warps per block and rows' k16 steps unrolled (loads in
  flight) of the gradients, apart and in one pass (``grads``, as ``linear_grads`` runs
  them); and the step's ReLU-gradient pass
  (``_cuda_epilogs.drelu``) with 1 and ``DRELU_UNROLL`` rows' loads in flight per thread
  (``--only tc`` runs just these).
The default launch shape of each kernel is marked. JSON out.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402

CALLS = 20


def graph_us(fn, replays=30):
    """Median GPU time of one ``fn()``: CALLS calls captured in one graph, replayed."""
    import cupy as cp

    from fuseflow.backend._cuda_graph import GraphCapture

    cap = GraphCapture()
    cap.run(fn)

    def calls():
        for _ in range(CALLS):
            fn()  # outputs dropped at once: each call reuses the last one's memory

    _, graph, _ = cap.capture(calls)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    with cap.stream:
        graph.launch(cap.stream)
        for _ in range(replays):
            start.record(cap.stream)
            graph.launch(cap.stream)
            stop.record(cap.stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / CALLS)
    return float(np.median(times))


SHAPES = [  # (label, batch, n, features, dtype)
    ("784-30-10 layer 1", 256, 30, 784, np.float32),
    ("784-30-10 layer 2", 256, 10, 30, np.float32),
    ("784-1024-1024-10 layer 3", 256, 10, 1024, np.float32),
    ("784-4096-4096-10 layer 3", 8192, 10, 4096, np.float32),
    ("784-4096-4096-10 layer 3", 8192, 10, 4096, np.float16),
]


def skinny_rows(cp, S):
    from fuseflow.backend.epilogs import relu_aux_rows

    rows = []
    for label, batch, n, feat, dtype in SHAPES:
        rng = cp.random.default_rng(0)
        x = cp.maximum(rng.standard_normal((batch, feat), dtype=np.float32), 0).astype(dtype)
        dy = rng.standard_normal((batch, n), dtype=np.float32).astype(dtype)
        w = (rng.standard_normal((n, feat), dtype=np.float32) * feat ** -0.5).astype(dtype)
        aux = cp.asfortranarray(
            rng.integers(0, 256, size=(-(-feat // 128) * 16, batch), dtype=np.uint8))
        base = {"shape": label, "batch": batch, "n": n, "features": feat,
                "dtype": np.dtype(dtype).name}
        v = S.columns_per_thread(n, dtype, batch, feat, x)
        default_rows = S.wgrad_rows_per_chunk(batch, feat + 1, v)
        default_round = S.outputs_per_round(n, v, dtype)
        for r in sorted({8, 16, 32, 64, 128, 256, 512, 1024, 2048, batch, default_rows}):
            if r > batch:
                continue
            for pr in sorted({1, default_round}):
                default = r == default_rows and pr == default_round
                for stage in (None, False) if default else (None,):
                    us = graph_us(lambda r=r, pr=pr, st=stage: S.wgrad(
                        dy, x, bgrad=True, rows=r, per_round=pr, stage=st))
                    red = S.wgrad_shared_bytes(v, dtype, pr)
                    rows.append({**base, "kernel": "wgrad", "rows_per_chunk": r,
                                 "chunks": -(-batch // r), "per_round": pr, "V": v, "us": us,
                                 "dy_staged": stage is None and
                                 S.stage_bytes(min(r, batch), n, dtype, red) > 0,
                                 "default": default and stage is None})
                    print(json.dumps(rows[-1]), flush=True)
        if batch * feat * n <= S.FORWARD_MAX_MACS:  # cuBLASLt runs the longer forwards
            b = rng.standard_normal((n,), dtype=np.float32).astype(dtype)
            rows_aux = relu_aux_rows(n)
            for spb in (1, 2, 4, 8):
                us = graph_us(lambda spb=spb: S.forward(x, w, b, relu=True, aux_rows=rows_aux,
                                                        samples_per_block=spb))
                rows.append({**base, "kernel": "forward", "samples_per_block": spb, "us": us,
                             "default": spb == S.forward_samples_per_block(feat)})
                print(json.dumps(rows[-1]), flush=True)
        if n == 30:
            continue  # the first layer's input gradient is never computed
        default_rpt = S.dgrad_rows_per_thread(batch)
        for rpt in sorted({1, 2, 4, 8, 16, 32, 64, max(1, batch // 8), default_rpt}):
            if 8 * rpt > batch and rpt != max(1, batch // 8):
                continue
            for stage in (None, False) if rpt == default_rpt else (None,):
                us = graph_us(lambda rpt=rpt, st=stage: S.dgrad(
                    dy, w, aux, aux.shape[0], bgrad=True, rpt=rpt, stage=st))
                red = S.dgrad_shared_bytes(v, dtype, bgrad=True)
                rows.append({**base, "kernel": "dgrad", "rows_per_thread": rpt,
                             "chunks": max(1, -(-batch // (8 * rpt))), "V": v, "us": us,
                             "dy_staged": stage is None and
                             S.stage_bytes(min(8 * rpt, batch), n, dtype, red) > 0,
                             "default": rpt == default_rpt and stage is None})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def tc_rows(cp, S, TC):
    """The float16 output layer of 784-4096-4096-10 at batch 8192: tensor-core kernels
    (rows per chunk swept) beside the SIMT kernels and cuBLASLt's forward."""
    from fuseflow.backend.cuda_backend import CudaBackend

    batch, n, feat, dtype = 8192, 10, 4096, np.float16
    rng = cp.random.default_rng(2)
    x = cp.maximum(rng.standard_normal((batch, feat), dtype=np.float32), 0).astype(dtype)
    dy = rng.standard_normal((batch, n), dtype=np.float32).astype(dtype)
    w = (rng.standard_normal((n, feat), dtype=np.float32) * feat ** -0.5).astype(dtype)
    b = rng.standard_normal((n,), dtype=np.float32).astype(dtype)
    aux = cp.asfortranarray(rng.integers(0, 256, size=(feat // 8, batch), dtype=np.uint8))
    base = {"shape": "784-4096-4096-10 layer 3", "batch": batch, "n": n, "features": feat,
            "dtype": "float16"}
    rows = []

    def add(kernel, form, fn, **extra):
        rows.append({**base, "kernel": kernel, "form": form, **extra, "us": graph_us(fn)})
        print(json.dumps(rows[-1]), flush=True)

    add("wgrad", "simt", lambda: S.wgrad(dy, x, bgrad=True), default=False)
    add("dgrad", "simt", lambda: S.dgrad(dy, w, aux, aux.shape[0], bgrad=True), default=False)
    shapes = [(r, TC.GRAD_WARPS, TC.GRAD_UNROLL) for r in (64, 128)]
    shapes += itertools.product((256, 512), (4, 8), (1, 2, 4))  # rows, warps, unrolled
    for kernel in ("wgrad", "dgrad", "grads"):  # grads: both in one pass (linear_grads)
        for r, wp, u in shapes:
            if kernel == "wgrad":
                fn = functools.partial(TC.wgrad, dy, x, bgrad=True, rows=r, warps=wp, unroll=u)
            elif kernel == "dgrad":
                fn = functools.partial(TC.dgrad, dy, w, aux, aux.shape[0], bgrad=True, rows=r,
                                       warps=wp, unroll=u)
            else:
                fn = functools.partial(TC.grads, dy, x, w, aux, aux.shape[0], bgrad_w=True,
                                       bgrad_x=True, rows=r, warps=wp, unroll=u)
            add(kernel, "tc", fn, rows_per_chunk=r, warps=wp, unroll=u,
                default=(r, wp, u) == (TC.ROWS_PER_CHUNK, TC.GRAD_WARPS,
                                       TC.GRADS_UNROLL if kernel == "grads" else TC.GRAD_UNROLL))
    from fuseflow.backend import _cuda_epilogs as E

    dx = cp.maximum(rng.standard_normal((batch, feat), dtype=np.float32), 0).astype(dtype)
    default_unroll = E.DRELU_UNROLL
    for unroll in (1, default_unroll):  # the layer-1 mask pass of the same step
        E.DRELU_UNROLL = unroll
        add("drelu", "own", lambda: E.drelu(dx, aux, aux.shape[0], bgrad=True),
            rows_unrolled=unroll, default=unroll == default_unroll)
    E.DRELU_UNROLL = default_unroll
    cb = CudaBackend(tf32=False)
    for form, on in (("cublaslt", False), ("tc", True)):
        cb.skinny_tc = on
        add("forward", form, lambda: cb.linear(x, w, b, "BIAS"), default=on)
    return rows


def mixed_update_rows(cp, F):
    """The large model's Adam step from float16 gradients scaled by 1024."""
    sizes = [784, 4096, 4096, 10]
    rng = cp.random.default_rng(1)
    params = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        params += [rng.standard_normal((o, i), dtype=np.float32),
                   rng.standard_normal((o,), dtype=np.float32)]
    low = [(rng.standard_normal(p.shape, dtype=np.float32) * 1024).astype(np.float16)
           for p in params]
    m = [cp.zeros_like(p) for p in params]
    v = [cp.zeros_like(p) for p in params]
    count = cp.asarray(3, dtype=cp.int32)
    inv = cp.asarray(1 / 1024, dtype=cp.float32)
    hyper = dict(step_const=-1e-3, count=count, b1=0.9, b2=0.999, eps=1e-8, in_place=True)

    def unscaled():
        g = F.multi_tensor_cast(low, np.float32, inv)
        ok = F.multi_tensor_all_finite(g)
        F.multi_tensor_update("adam", params, g, [m, v], finite=ok, **hyper)

    def scaled():
        ok = F.multi_tensor_all_finite(low, inv)
        F.multi_tensor_update("adam", params, low, [m, v], finite=ok, grad_scale=inv, **hyper)

    n = sum(p.size for p in params)
    rows = []
    for name, fn in (("cast + all_finite + adam (float32 grads)", unscaled),
                     ("all_finite + adam (scaled float16 grads)", scaled),
                     ("all_finite (scaled float16 grads)",
                      lambda: F.multi_tensor_all_finite(low, inv))):
        rows.append({"kernel": name, "elements": n, "us": graph_us(fn)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def best_tc_launch(rows):
    """The tensor-core gradients' launch shape with the least weight- plus input-gradient
    time, as a settings_ab.py ``--setting`` (the kernels share these constants)."""
    total = {}
    for r in rows:
        if r.get("form") == "tc" and r["kernel"] in ("wgrad", "dgrad") and "warps" in r:
            key = (r["rows_per_chunk"], r["warps"], r["unroll"])
            total.setdefault(key, {})[r["kernel"]] = r["us"]
    both = {k: v["wgrad"] + v["dgrad"] for k, v in total.items() if len(v) == 2}
    if not both:
        raise SystemExit("no tensor-core wgrad/dgrad rows with a launch shape in the sweep")
    rpc, warps, unroll = min(both, key=both.get)
    return (f"_cuda_skinny_tc.ROWS_PER_CHUNK={rpc},_cuda_skinny_tc.GRAD_WARPS={warps},"
            f"_cuda_skinny_tc.GRAD_UNROLL={unroll}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for the JSON (required unless --print-best)")
    ap.add_argument("--only", choices=["tc"], help="only the tensor-core comparison")
    ap.add_argument("--print-best", metavar="JSON",
                    help="print the fastest tensor-core launch shape of a sweep's JSON as a "
                         "settings_ab.py --setting, and exit")
    args = ap.parse_args()
    if args.print_best:
        print(best_tc_launch(json.loads(Path(args.print_best).read_text())["rows"]))
        return
    if not args.out:
        ap.error("--out is required")
    import cupy as cp

    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_skinny as S
    from fuseflow.backend import _cuda_skinny_tc as TC

    rows = tc_rows(cp, S, TC)
    if args.only is None:
        rows += skinny_rows(cp, S) + mixed_update_rows(cp, F)
    name = "skinny_sweep_tc.json" if args.only else "skinny_sweep.json"
    write_json(os.path.join(args.out, name),
               {"benchmark": "skinny_sweep", **metadata("cupy", "nvmath"), "rows": rows,
                "note": f"median GPU time per call: {CALLS} calls in one CUDA graph"})


if __name__ == "__main__":
    main()
