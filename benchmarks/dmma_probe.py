"""How fast are the FP64 tensor cores' ``mma.sync`` shapes on this GPU, and what are their
fragment layouts?

    python benchmarks/dmma_probe.py --out DIR

The own matmul's float64 tensor-core form (``_cuda_gemm``, ``mma="f64"``) first used Ampere's
``mma.m8n8k4`` and reached 16-23 TFLOP/s at the medium model's shapes, while cuBLASLt's
float64 kernels reached 35-42 (``session14_fp64_probe.json``). Hopper added
``mma.m16n8k{4,8,16}`` for float64. For each shape this checks, on one tile of random
numbers against NumPy, the fragment layout the kernel assumes, and measures the
instruction's rate: every warp runs ``CHAINS`` independent accumulator chains of ``iters``
MMAs, the grid a few blocks per SM, timed with CUDA events (median of repeats). JSON out.
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

CHAINS = 8

# (name, M, N, K): the shapes of mma.sync with float64 operands and accumulators
SHAPES = [("m8n8k4", 8, 8, 4), ("m16n8k4", 16, 8, 4), ("m16n8k8", 16, 8, 8),
          ("m16n8k16", 16, 8, 16)]

_SRC = r"""
#define M_ SHAPE_M
#define K_ SHAPE_K
#define NA (M_ * K_ / 32)
#define NB (K_ * 8 / 32)
#define ND (M_ * 8 / 32)

// The layout assumed (PTX ISA, "Matrix fragments for mma.m16n8k*" with .f64): lane (g, t) =
// (lane / 4, lane % 4); a[i] = A(g + 8 (i % 2), t + 4 (i / 2)); b[i] = B(t + 4 i, g);
// d[i] = D(g + 8 (i / 2), 2 t + i % 2). For m8n8k4: a = A(g, t), b = B(t, g), d[i] = D(g, 2t + i).
__device__ __forceinline__ int a_row(int g, int i) { return g + (M_ == 16 ? 8 * (i % 2) : 0); }
__device__ __forceinline__ int a_col(int t, int i) { return t + (M_ == 16 ? 4 * (i / 2) : 0); }
__device__ __forceinline__ int b_row(int t, int i) { return t + 4 * i; }
__device__ __forceinline__ int d_row(int g, int i) { return g + 8 * (i / 2); }
__device__ __forceinline__ int d_col(int t, int i) { return 2 * t + i % 2; }

__device__ __forceinline__ void mma(double (&d)[ND], const double (&a)[NA], const double (&b)[NB]) {
#if M_ == 8
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d[0]), "+d"(d[1]) : "d"(a[0]), "d"(b[0]));
#elif K_ == 4
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, "
                 "{%6}, {%0, %1, %2, %3};"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a[0]), "d"(a[1]), "d"(b[0]));
#elif K_ == 8
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
                   "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#endif
}

// One tile: D = A (M x K, row-major) @ B (K x 8, row-major), one warp.
extern "C" __global__ void one_tile(const double* A, const double* B, double* D) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    double a[NA], b[NB], d[ND];
    for (int i = 0; i < NA; ++i) a[i] = A[a_row(g, i) * K_ + a_col(t, i)];
    for (int i = 0; i < NB; ++i) b[i] = B[b_row(t, i) * 8 + g];
    for (int i = 0; i < ND; ++i) d[i] = 0.0;
    mma(d, a, b);
    for (int i = 0; i < ND; ++i) D[d_row(g, i) * 8 + d_col(t, i)] = d[i];
}

// CHAINS independent accumulators per warp, iters MMAs each.
extern "C" __global__ void rate(double* out, int iters) {
    double a[NA], b[NB], d[CHAINS][ND];
    for (int i = 0; i < NA; ++i) a[i] = 1e-3 * (threadIdx.x + i);
    for (int i = 0; i < NB; ++i) b[i] = 1e-3 * (blockIdx.x + i);
    for (int c = 0; c < CHAINS; ++c)
        for (int i = 0; i < ND; ++i) d[c][i] = 0.0;
    for (int it = 0; it < iters; ++it) {
        #pragma unroll
        for (int c = 0; c < CHAINS; ++c) mma(d[c], a, b);
    }
    double s = 0.0;
    for (int c = 0; c < CHAINS; ++c)
        for (int i = 0; i < ND; ++i) s += d[c][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def kernels(m, k):
    import cupy as cp

    head = f"#define SHAPE_M {m}\n#define SHAPE_K {k}\n#define CHAINS {CHAINS}\n"
    mod = cp.RawModule(code=head + _SRC, options=("-std=c++17",))
    return mod.get_function("one_tile"), mod.get_function("rate")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import cupy as cp

    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    rng = np.random.default_rng(0)
    rows = []
    for name, m, n, k in SHAPES:
        one_tile, rate = kernels(m, k)
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, n))
        d = cp.zeros((m, n))
        one_tile((1,), (32,), (cp.asarray(a), cp.asarray(b), d))
        err = float(np.abs(cp.asnumpy(d) - a @ b).max())
        for warps in (4, 8):
            for per_sm in (1, 2):
                blocks = sms * per_sm
                out = cp.empty(blocks * 32 * warps)
                rate((blocks,), (32 * warps,), (out, np.int32(args.iters)))
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                times = []
                for _ in range(args.repeats):
                    start.record()
                    rate((blocks,), (32 * warps,), (out, np.int32(args.iters)))
                    stop.record()
                    stop.synchronize()
                    times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
                s = float(np.median(times))
                flops = 2.0 * m * n * k * CHAINS * args.iters * warps * blocks
                row = {"shape": name, "layout_max_abs_err": err, "warps_per_block": warps,
                       "blocks_per_sm": per_sm, "seconds": s, "tflops": flops / s / 1e12}
                rows.append(row)
                print(f"{name:9s} layout err {err:.1e}  {warps:2d} warps x {per_sm} blocks/SM: "
                      f"{row['tflops']:6.1f} TFLOP/s", flush=True)
    write_json(os.path.join(args.out, "dmma_probe.json"),
               {"benchmark": "dmma_probe", **metadata("cupy"), "chains": CHAINS,
                "iters": args.iters, "rows": rows})


if __name__ == "__main__":
    main()
