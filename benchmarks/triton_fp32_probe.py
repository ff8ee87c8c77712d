"""Is there a faster full-float32 matmul than cuBLAS's at the medium model's shapes?

    python benchmarks/triton_fp32_probe.py --out DIR

A feasibility probe, not a fuseflow path: Triton (on the device machine, not a fuseflow
dependency) compiles a plain SIMT matmul (``tl.dot(..., input_precision="ieee")``: no TF32)
over a grid of tile shapes, warps, pipeline stages and K splits, for each of the five
matmuls of a 784-1024-1024-10 step at batch 256, in the layouts the step uses. Each is timed
against ``torch.mm`` with TF32 off (cuBLAS's SIMT kernels, as JAX and fuseflow get them) the
way a compiled step runs them: 20 calls in one CUDA graph, median over replays. Split-K
variants add their partials with atomics into a zeroed output (the zeroing is timed too);
their sums are checked against float64 like the others. JSON out.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _meta import metadata, write_json  # noqa: E402

CALLS = 20
# (label, m, n, k, a_layout, b_layout): C (m, n) = A (m, k) @ B (k, n); "mk" = A row-major
# (k contiguous), "km" = A stored (k, m) (m contiguous); "kn" / "nk" likewise for B.
SHAPES = [
    ("layer 1 forward x @ w1.T", 256, 1024, 784, "mk", "nk"),
    ("layer 2 forward x @ w2.T", 256, 1024, 1024, "mk", "nk"),
    ("layer 2 input gradient dy @ w2", 256, 1024, 1024, "mk", "kn"),
    ("layer 2 weight gradient dy.T @ x", 1024, 1024, 256, "km", "kn"),
    ("layer 1 weight gradient dy.T @ x", 1024, 784, 256, "km", "kn"),
]
CONFIGS = [dict(BM=bm, BN=bn, BK=bk, num_warps=w, num_stages=s)
           for bm, bn, bk, w, s in itertools.product((32, 64, 128), (64, 128), (16, 32),
                                                     (4, 8), (2, 4))]
SPLITS = (1, 2, 4, 8)


def graph_us(torch, fn, replays=30):
    """Median GPU time of one ``fn()``: CALLS calls captured in one graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / CALLS)
    return float(np.median(times))


def build_kernel(triton, tl):
    @triton.jit
    def matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, kchunk,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ATOMIC: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        k0 = tl.program_id(2) * kchunk
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        kend = tl.minimum(K, k0 + kchunk)
        for kk in range(k0, kend, BK):
            ks = kk + rk
            av = tl.load(a + rm[:, None] * sam + ks[None, :] * sak,
                         mask=(rm[:, None] < M) & (ks[None, :] < kend), other=0.0)
            bv = tl.load(b + ks[:, None] * sbk + rn[None, :] * sbn,
                         mask=(ks[:, None] < kend) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(av, bv, acc, input_precision="ieee")
        cp = c + rm[:, None] * scm + rn[None, :] * scn
        cmask = (rm[:, None] < M) & (rn[None, :] < N)
        if ATOMIC:
            tl.atomic_add(cp, acc, mask=cmask)
        else:
            tl.store(cp, acc, mask=cmask)

    return matmul


def operands(torch, m, n, k, a_layout, b_layout, gen):
    a = torch.randn((m, k) if a_layout == "mk" else (k, m), device="cuda", generator=gen)
    b = torch.randn((k, n) if b_layout == "kn" else (n, k), device="cuda", generator=gen)
    return (a if a_layout == "mk" else a.t()), (b if b_layout == "kn" else b.t())


def make_call(triton, kernel, a, b, c, cfg, splits):
    """``fn()`` that runs the kernel for C = A @ B, or None when K does not split that way."""
    m, k = a.shape
    n = b.shape[1]
    kchunk = -(-k // splits)
    kchunk = -(-kchunk // cfg["BK"]) * cfg["BK"]
    if -(-k // kchunk) != splits:
        return None
    grid = (triton.cdiv(m, cfg["BM"]), triton.cdiv(n, cfg["BN"]), splits)
    atomic = splits > 1

    def call():
        if atomic:
            c.zero_()
        kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), kchunk, BM=cfg["BM"], BN=cfg["BN"],
                     BK=cfg["BK"], ATOMIC=atomic, num_warps=cfg["num_warps"],
                     num_stages=cfg["num_stages"])
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    import triton
    import triton.language as tl

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    kernel = build_kernel(triton, tl)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, m, n, k, al, bl in SHAPES:
        a, b = operands(torch, m, n, k, al, bl, gen)
        ref = (a.double() @ b.double())
        c = torch.empty((m, n), device="cuda")
        cublas_us = graph_us(torch, lambda: torch.mm(a, b, out=c))
        cublas_err = float(((c.double() - ref).abs().max() / ref.abs().max()).item())
        flops = 2.0 * m * n * k
        variants = []
        for cfg, splits in itertools.product(CONFIGS, SPLITS):
            call = make_call(triton, kernel, a, b, c, cfg, splits)
            if call is None:
                continue
            v = {**cfg, "splits": splits}
            try:
                call()
                torch.cuda.synchronize()
                err = float(((c.double() - ref).abs().max() / ref.abs().max()).item())
                us = graph_us(torch, call, replays=15)
            except Exception as e:  # noqa: BLE001 - record and go on
                v["error"] = str(e)[:160]
                variants.append(v)
                continue
            variants.append({**v, "us": us, "tflops": flops / us / 1e6, "max_rel_err": err})
        ok = sorted((v for v in variants if "us" in v), key=lambda v: v["us"])
        best = ok[:5]
        # the best five again, longer, interleaved with cuBLAS
        for v in best:
            cfg = {key: v[key] for key in ("BM", "BN", "BK", "num_warps", "num_stages")}
            call = make_call(triton, kernel, a, b, c, cfg, v["splits"])
            v["us_again"] = graph_us(torch, call, replays=60)
            v["cublas_us_again"] = graph_us(torch, lambda: torch.mm(a, b, out=c), replays=60)
        row = {"label": label, "m": m, "n": n, "k": k, "a_layout": al, "b_layout": bl,
               "cublas_us": cublas_us, "cublas_tflops": flops / cublas_us / 1e6,
               "cublas_max_rel_err": cublas_err, "best": best,
               "variants_timed": len(ok), "variants_failed": len(variants) - len(ok),
               "errors": sorted({v["error"] for v in variants if "error" in v})[:5]}
        rows.append(row)
        write_json(os.path.join(args.out, "triton_fp32_probe.json"),
                   {"benchmark": "triton_fp32_probe", **metadata("torch", "triton"),
                    "rows": rows, "note": "us per call, 20 calls in one CUDA graph, median; "
                    "torch.mm with allow_tf32=False is cuBLAS's SIMT path"})
        if not best:
            print(f"{label}: every variant failed: {row['errors']}", flush=True)
            continue
        print(f"{label:36s} cublas {cublas_us:7.2f} us  triton best {best[0]['us']:7.2f} "
              f"(again {best[0]['us_again']:.2f} vs {best[0]['cublas_us_again']:.2f}) "
              f"{ {key: best[0][key] for key in ('BM', 'BN', 'BK', 'num_warps', 'num_stages', 'splits')} }"
              f" err {best[0]['max_rel_err']:.1e}", flush=True)


if __name__ == "__main__":
    main()
