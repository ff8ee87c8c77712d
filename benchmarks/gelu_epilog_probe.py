"""What cuBLASLt's GELU and ReLU epilogs cost on top of a plain matmul, per shape and dtype.

    python benchmarks/gelu_epilog_probe.py --out DIR

Why: the thirty-sixth session found cuBLASLt running RELU_AUX_BIAS after its sm90 TF32
matmuls as a separate kernel (285 us for an 8192 x 4096 output, where a fused pass takes
89), which fuseflow now replaces with its own epilog pass; the thirty-seventh session gave
GELU_AUX_BIAS and DGELU_BGRAD the same own pass (float32 and float64). This probe measures, in one process, for the forward
(``linear``) and the input gradient (``linear_dgrad``) of the benchmark layers:

- the plain matmul (DEFAULT), the reference;
- RELU_AUX_BIAS / DRELU_BGRAD and GELU_AUX_BIAS / DGELU_BGRAD the way the backend runs
  them by default (its own pass where ``_own_epilog`` says so) and through cuBLASLt
  (``own_epilog="off"``);
- a standalone GELU (``activation``) over the same output, an upper bound for what an own
  GELU epilog pass would add (it reads and writes the whole output once more).

Medians of CUDA-event times (cupyx.profiler.benchmark). JSON out, with the excess of each
epilog over the plain matmul.
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

#: (batch, in, out) of the benchmark models' hidden layers.
SHAPES = ((8192, 784, 4096), (8192, 4096, 4096), (256, 784, 1024), (256, 1024, 1024))
PRECISIONS = ("float32", "tf32", "bfloat16")


def median_us(fn, repeat):
    from cupyx.profiler import benchmark

    r = benchmark(fn, n_repeat=repeat, n_warmup=5)
    return float(np.median(r.gpu_times[0]) * 1e6)


def shape_rows(cp, be, batch, n_in, n_out, dtype, repeat):
    """Every variant's median for one layer shape, forward and input gradient."""
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((batch, n_in), dtype=np.float32).astype(dtype)
    w = (rng.standard_normal((n_out, n_in), dtype=np.float32) * n_in ** -0.5).astype(dtype)
    b = (rng.standard_normal((n_out,), dtype=np.float32) * 0.1).astype(dtype)
    # The input gradient of the next layer (n_out -> n_out) through this layer's aux.
    w2 = (rng.standard_normal((n_out, n_out), dtype=np.float32) * n_out ** -0.5).astype(dtype)
    dy = rng.standard_normal((batch, n_out), dtype=np.float32).astype(dtype)
    _, relu_aux = be.linear(x, w, b, "RELU_AUX_BIAS")
    _, gelu_aux = be.linear(x, w, b, "GELU_AUX_BIAS")
    y = be.linear(x, w, None, "DEFAULT")[0]

    def own(mode, fn):
        def call():
            be.own_epilog = mode
            return fn()
        return call

    variants = {
        ("forward", "plain"): own("auto", lambda: be.linear(x, w, None, "DEFAULT")),
        ("forward", "relu default"): own("auto", lambda: be.linear(x, w, b, "RELU_AUX_BIAS")),
        ("forward", "relu cublaslt"): own("off", lambda: be.linear(x, w, b, "RELU_AUX_BIAS")),
        ("forward", "gelu default"): own("auto", lambda: be.linear(x, w, b, "GELU_AUX_BIAS")),
        ("forward", "gelu cublaslt"): own("off", lambda: be.linear(x, w, b, "GELU_AUX_BIAS")),
        ("forward", "gelu standalone"): own("auto", lambda: be.activation(y, "gelu")),
        ("dgrad", "plain"): own("auto", lambda: be.linear_dgrad(dy, w2, "DEFAULT")),
        ("dgrad", "relu default"): own("auto", lambda: be.linear_dgrad(dy, w2, "DRELU_BGRAD",
                                                                       relu_aux)),
        ("dgrad", "relu cublaslt"): own("off", lambda: be.linear_dgrad(dy, w2, "DRELU_BGRAD",
                                                                       relu_aux)),
        ("dgrad", "gelu default"): own("auto", lambda: be.linear_dgrad(dy, w2, "DGELU_BGRAD",
                                                                       gelu_aux)),
        ("dgrad", "gelu cublaslt"): own("off", lambda: be.linear_dgrad(dy, w2, "DGELU_BGRAD",
                                                                       gelu_aux)),
    }
    rows = []
    for (op, variant), fn in variants.items():
        rows.append({"op": op, "variant": variant, "batch": batch, "in": n_in, "out": n_out,
                     "us": median_us(fn, repeat)})
    be.own_epilog = "auto"
    for op in ("forward", "dgrad"):
        plain = next(r["us"] for r in rows if r["op"] == op and r["variant"] == "plain")
        for r in rows:
            if r["op"] == op:
                r["excess_us"] = r["us"] - plain if r["variant"] != "gelu standalone" \
                    else r["us"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    args = ap.parse_args()
    import cupy as cp

    from fuseflow._dtypes import bfloat16
    from fuseflow.backend.cuda_backend import CudaBackend

    rows = []
    for prec in args.precisions:
        be = CudaBackend(tf32=prec == "tf32", autotune=False)
        be.fp32_wgmma = "off"  # every variant on cuBLASLt's products: the epilogs' cost
        dtype = np.float32 if prec in ("float32", "tf32") else bfloat16
        for batch, n_in, n_out in SHAPES:
            for r in shape_rows(cp, be, batch, n_in, n_out, dtype, args.repeat):
                rows.append({"precision": prec, **r})
                print(f"{prec:8s} {batch:5d}x{n_in:4d}->{n_out:4d} {r['op']:7s} "
                      f"{r['variant']:16s} {r['us']:9.1f} us  (+{r['excess_us']:.1f})",
                      flush=True)
    write_json(os.path.join(args.out, "gelu_epilog_probe.json"),
               {"benchmark": "gelu_epilog_probe", **metadata("cupy", "nvmath"), "rows": rows,
                "note": "median GPU time per call (CUDA events), one process; excess_us: "
                        "over the plain matmul of the same op (the standalone GELU: its own "
                        "time)"})


if __name__ == "__main__":
    main()
