"""The medium model's layer-2 forward matmul, cuBLASLt path then fuseflow's own kernel.

    ncu --clock-control none --section ... python benchmarks/gemm_pair.py

A target for Nsight Compute: after a warm-up, runs ``linear(x, w, b, "RELU_AUX_BIAS")`` at
256 x 1024 -> 1024 in full float32 three times through cuBLASLt (its SIMT kernel, split-K
reduction and fuseflow's epilog pass) and three times through ``_cuda_gemm`` (one launch),
so that the profiler's counters of the two main loops can be read side by side.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from fuseflow.backend.cuda_backend import CudaBackend


def main():
    rng = cp.random.default_rng(0)
    x = cp.maximum(rng.standard_normal((256, 1024), dtype=np.float32), 0)
    w = rng.standard_normal((1024, 1024), dtype=np.float32) / 32.0
    b = rng.standard_normal(1024, dtype=np.float32)
    cublas = CudaBackend(tf32=False, autotune=False)
    cublas.own_gemm_max_macs = 0
    own = CudaBackend(tf32=False, autotune=False)
    own.own_gemm_max_macs = 2 ** 62
    for be in (cublas, own):  # plans and compiles outside the profiled range
        be.linear(x, w, b, "RELU_AUX_BIAS")
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStart()
    for be in (cublas, own):
        for _ in range(3):
            be.linear(x, w, b, "RELU_AUX_BIAS")
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStop()
    print(cublas.stats(), own.stats())


if __name__ == "__main__":
    main()
