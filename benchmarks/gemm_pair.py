"""The medium model's layer-2 forward matmul, cuBLASLt path then fuseflow's own kernel.

    ncu --clock-control none --section ... python benchmarks/gemm_pair.py [--mma f64] [--dgemm]

A target for Nsight Compute: after a warm-up, runs ``linear(x, w, b, "RELU_AUX_BIAS")`` at
256 x 1024 -> 1024 in full float32 three times through cuBLASLt (its SIMT kernel, split-K
reduction and fuseflow's epilog pass) and three times through ``_cuda_gemm`` (one launch,
its inner product ``--mma``), so that the profiler's counters of the two main loops can be
read side by side. ``--dgemm`` adds three runs of the same layer in float64 through
cuBLASLt (its FP64 tensor-core kernel: the rate the own float64 form is measured against).
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np

from fuseflow.backend.cuda_backend import CudaBackend
from gemm_sweep import cublaslt_fp32


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mma", default="simt", help="the own kernel's inner product")
    ap.add_argument("--dgemm", action="store_true", help="also the layer in float64")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    rng = cp.random.default_rng(0)
    x = cp.maximum(rng.standard_normal((args.batch, 1024), dtype=np.float32), 0)
    w = rng.standard_normal((1024, 1024), dtype=np.float32) / 32.0
    b = rng.standard_normal(1024, dtype=np.float32)
    cublas = cublaslt_fp32()
    own = CudaBackend(tf32=False, autotune=False)
    own.own_gemm_max_macs = 2 ** 62
    own.own_gemm_mma = args.mma
    runs = [(cublas, (x, w, b)), (own, (x, w, b))]
    if args.dgemm:
        runs.append((cublas, tuple(a.astype(np.float64) for a in (x, w, b))))
    for be, ops in runs:  # plans and compiles outside the profiled range
        be.linear(*ops, "RELU_AUX_BIAS")
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStart()
    for be, ops in runs:
        for _ in range(3):
            be.linear(*ops, "RELU_AUX_BIAS")
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStop()
    print(cublas.stats(), own.stats())


if __name__ == "__main__":
    main()
