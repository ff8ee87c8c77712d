"""fuseflow's own kernels in the shapes of the benchmark steps, each variant side by side.

    python benchmarks/kernels.py --out DIR

Times (CUDA events around each call, median of ``--repeat``; cupyx.profiler.benchmark):
- the skinny weight and input gradients of the output layer (10 classes) at batch 8192
  over 4096 features (float16 and float32) and at batch 256 over 1024 (float32), with one
  column per thread (V = 1) against the vector form (V columns, 16-byte accesses), and
  cuBLASLt for reference;
- the multi-tensor Adam update over 784-4096-4096-10's params (float32) for several grid
  caps (``_cuda_fused.BLOCKS_PER_SM``);
- the finiteness check of float32 grads, and mixed precision's kernels (params + batch
  cast to float16, finiteness of scaled float16 grads, Adam from them) with 4 elements per
  thread against 16 bytes per access of the 16-bit arrays (``_cuda_fused.VECTOR_BYTES``).
Each row carries the bytes it must move and the resulting GB/s. JSON out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402


def median_us(fn, repeat):
    from cupyx.profiler import benchmark

    r = benchmark(fn, n_repeat=repeat, n_warmup=5)
    return float(np.median(r.gpu_times[0]) * 1e6)


def skinny_rows(cp, be, S, repeat):
    rows, default = [], S.VECTOR_MIN_ELEMENTS
    for batch, feat, dtype in ((8192, 4096, np.float16), (8192, 4096, np.float32),
                               (256, 1024, np.float32)):
        rng = cp.random.default_rng(0)
        h, aux = be.activation(rng.standard_normal((batch, feat), dtype=np.float32)
                               .astype(dtype), "relu")
        w = (rng.standard_normal((10, feat), dtype=np.float32) * feat ** -0.5).astype(dtype)
        dy = rng.standard_normal((batch, 10), dtype=np.float32).astype(dtype)
        item = np.dtype(dtype).itemsize
        moved = {"wgrad": batch * feat * item, "dgrad": batch * feat * item + aux.nbytes}
        ops = {"wgrad": lambda: be.linear_wgrad(dy, h, "BGRADB"),
               "dgrad": lambda: be.linear_dgrad(dy, w, "DRELU_BGRAD", aux)}
        for variant in ("V=1", "vector", "cublaslt"):
            be.skinny_max = 0 if variant == "cublaslt" else S.MAX_N
            be.own_epilog = "off" if variant == "cublaslt" else "auto"  # cuBLASLt's DRELU
            S.VECTOR_MIN_ELEMENTS = 2 ** 62 if variant == "V=1" else 0
            for op, fn in ops.items():
                us = median_us(fn, repeat)
                rows.append({"kernel": f"output layer {op}", "batch": batch, "features": feat,
                             "dtype": np.dtype(dtype).name, "variant": variant, "us": us,
                             "GB/s": moved[op] / us / 1e3})
                print(json.dumps(rows[-1]), flush=True)
    be.skinny_max, be.own_epilog = S.MAX_N, "auto"
    S.VECTOR_MIN_ELEMENTS = default
    return rows


def large_params(cp, dtype=np.float32):
    sizes = [784, 4096, 4096, 10]
    rng = cp.random.default_rng(1)
    out = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        out += [rng.standard_normal((o, i), dtype=np.float32).astype(dtype),
                rng.standard_normal((o,), dtype=np.float32).astype(dtype)]
    return out


def multi_tensor_rows(cp, F, repeat):
    rows = []
    params = large_params(cp)
    grads = large_params(cp)
    m, v = large_params(cp), [abs(a) for a in large_params(cp)]
    count = cp.asarray(3, dtype=cp.int32)
    n = sum(p.size for p in params)
    default = F.BLOCKS_PER_SM
    for cap in (4, 8, 16, 32, 2 ** 20):
        F.BLOCKS_PER_SM = cap
        us = median_us(lambda: F.multi_tensor_update(
            "adam", params, grads, [m, v], step_const=-1e-3, count=count, b1=0.9, b2=0.999,
            eps=1e-8, in_place=True), repeat)
        rows.append({"kernel": "adam update", "elements": n, "blocks_per_sm": cap, "us": us,
                     "GB/s": 7 * 4 * n / us / 1e3})
        print(json.dumps(rows[-1]), flush=True)
    F.BLOCKS_PER_SM = default
    x = cp.random.default_rng(2).standard_normal((8192, 784), dtype=np.float32)
    us = median_us(lambda: x.astype(np.float16), repeat)
    rows.append({"kernel": "batch cast (CuPy astype)", "elements": x.size, "us": us,
                 "GB/s": 6 * x.size / us / 1e3})
    us = median_us(lambda: F.multi_tensor_all_finite(grads), repeat)
    rows.append({"kernel": "all_finite float32 grads", "elements": n, "us": us,
                 "GB/s": 4 * n / us / 1e3})
    print(json.dumps(rows[-1]), flush=True)
    # mixed precision's kernels, 4 elements per thread (vector_bytes 8) against 16 bytes
    # per access of the 16-bit arrays (8 elements)
    g16 = [g.astype(np.float16) for g in grads]
    inv = cp.asarray(1 / 1024, dtype=cp.float32)
    default = F.VECTOR_BYTES
    for vb in (8, 16):
        F.VECTOR_BYTES = vb
        for name, leaves in (("params cast", params), ("params + batch cast", [*params, x])):
            k = sum(a.size for a in leaves)
            us = median_us(lambda: F.multi_tensor_cast(leaves, np.float16), repeat)
            rows.append({"kernel": name, "vector_bytes": vb, "elements": k, "us": us,
                         "GB/s": 6 * k / us / 1e3})
            print(json.dumps(rows[-1]), flush=True)
        us = median_us(lambda: F.multi_tensor_all_finite(g16, scale=inv), repeat)
        rows.append({"kernel": "all_finite float16 grads, scaled", "vector_bytes": vb,
                     "elements": n, "us": us, "GB/s": 2 * n / us / 1e3})
        print(json.dumps(rows[-1]), flush=True)
        ok = cp.ones((), dtype=cp.bool_)
        us = median_us(lambda: F.multi_tensor_update(
            "adam", params, g16, [m, v], step_const=-1e-3, count=count, b1=0.9, b2=0.999,
            eps=1e-8, in_place=True, finite=ok, grad_scale=inv), repeat)
        rows.append({"kernel": "adam update, float16 grads, scaled", "vector_bytes": vb,
                     "elements": n, "us": us, "GB/s": (6 * 4 + 2) * n / us / 1e3})
        print(json.dumps(rows[-1]), flush=True)
    F.VECTOR_BYTES = default
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    import cupy as cp

    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_skinny as S
    from fuseflow.backend.cuda_backend import CudaBackend

    be = CudaBackend(tf32=False, autotune=False)
    rows = skinny_rows(cp, be, S, args.repeat) + multi_tensor_rows(cp, F, args.repeat)
    write_json(os.path.join(args.out, "kernels.json"),
               {"benchmark": "kernels", **metadata("cupy", "nvmath"), "rows": rows,
                "note": "median GPU time per call (CUDA events), one process"})


if __name__ == "__main__":
    main()
