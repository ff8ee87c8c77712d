"""Can a pipelined 3xTF32 matmul beat cuBLASLt's full-float32 SIMT kernels at batch 256?

    python benchmarks/tf32x3_pipe_probe.py --out DIR [--quick]

Issue 5's two open targets (the medium full-float32 step at 0.75x JAX, time to 98%) wait
on full-float32 matmuls faster than cuBLASLt's at the medium model's shapes (benchmarks.md,
"What is left"). The own kernel's 3xTF32 form (``_cuda_gemm``, ``mma="tf32x3"``) was as
accurate as float32 but no faster: one warp per scheduler, loads through registers, a
k-tile's fresh sums beside its accumulators. This probe is the kernel that section asks
for, standalone, before any of it goes into the backend:

- a ``STAGES``-deep ``cp.async`` pipeline (global to shared memory without registers);
- 4 or 8 warps a block (one or two per scheduler), each a (BM / WM) x (BN / WN) block of C on
  ``mma.m16n8k8.tf32``, every product accumulated straight into the float32 sums in
  CUTLASS's order (small products first: a_lo b_hi, a_hi b_lo, a_hi b_hi);
- K split over the blocks of a thread-block cluster, added through distributed shared
  memory in rank order (deterministic, one launch, no workspace).

For each of the five matmuls of 784-1024-1024-10 at batch 256 (operands shaped, laid out
and scaled as the step has them, as in ``tf32x3_probe.py``): cuBLASLt's plain float32
product (the backend with the own matmul off), its TF32 product, and this kernel over a sweep of tiles, K
splits and pipeline depths, each timed like a compiled step runs it (20 calls in one CUDA
graph, median over replays) and checked against the float64 product of the same float32
operands (norm-relative and componentwise errors; a variant whose norm-relative error is
above ``MAX_NORM_REL`` is reported as wrong, not timed). ``--products 1`` times plain
TF32 (one product) as the tensor cores' ceiling. JSON out (``tf32x3_pipe_probe.json``).

Measured on an H100 (calls 184, 186, 187; benchmarks.md, "What is left"): slower than
cuBLASLt's float32 at all five products, 3-36x less accurate with the sums in the tensor
cores' accumulators, and one TF32 product twice cuBLASLt's TF32 time (an sm90 ``wgmma``
kernel). So none of it went into the backend.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from gemm_sweep import LAYERS, cublaslt_fp32  # noqa: E402

from fuseflow.backend._cuda_gemm import CLUSTER_SRC, TF32X3_SRC  # noqa: E402
from fuseflow.backend._cuda_wgmma import CP_ASYNC_SRC  # noqa: E402

#: A variant more than this far from the float64 product (norm-relative) is wrong: float32
#: FMAs measured 1.5-5.8e-7 at these shapes, 3xTF32 1.5-2.0e-7, TF32 2.9e-4 (call 129).
MAX_NORM_REL = {3: 2e-6, 1: 2e-3}

#: The cluster's K-split sums: each block adds its share of the SPLITS partial tiles
#: through distributed shared memory (also ``wgmma_probe.py``'s); needs ``CLUSTER_SRC``,
#: SPLITS and THREADS.
CLUSTER_SUM_SRC = r"""
// The SPLITS partial tiles (ROWS x COLS floats at Cs, row stride LD, in each block of the
// cluster) added in rank order, this block the rows rank, rank + SPLITS, ..., and stored
// into C (row-major, ldc) from (m0, n0), within M x N. Deterministic, no workspace.
template <int ROWS, int COLS, int LD>
__device__ __forceinline__ void cluster_sum_store(const float* Cs, float* __restrict__ C,
                                                  long long ldc, int m0, int n0, int M, int N) {
    cluster_sync();
    const unsigned int rank = blockIdx.z;
    for (int e = threadIdx.x; e < (ROWS / SPLITS) * (COLS / 4); e += THREADS) {
        const int r = (e / (COLS / 4)) * SPLITS + rank, c = 4 * (e % (COLS / 4));
        float4 s = load_peer(Cs + r * LD + c, 0);
#pragma unroll
        for (int q = 1; q < SPLITS; ++q) {
            const float4 v = load_peer(Cs + r * LD + c, q);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
        if (m0 + r < M && n0 + c < N)
            *reinterpret_cast<float4*>(C + (long long)(m0 + r) * ldc + n0 + c) = s;
    }
    cluster_sync();  // peers keep their shared memory until every block has read it
}
"""

SRC = r"""
#define THREADS (32 * WM * WN)
#define WTM (BM / WM)
#define WTN (BN / WN)
#define MI (WTM / 16)
#define NJ (WTN / 8)
// Shared-memory tiles: a k-major operand as [rows][BK + 4] (fragment reads 4 g + t apart
// mod 32), an m- or n-major one as [BK][cols + 8] (8 t + g apart): no bank conflicts.
#define A_LD (A_KMAJOR ? BK + 4 : BM + 8)
#define B_LD (B_KMAJOR ? BK + 4 : BN + 8)
#define A_STAGE ((A_KMAJOR ? BM : BK) * A_LD)
#define B_STAGE ((B_KMAJOR ? BN : BK) * B_LD)
#define STAGE_FLOATS (A_STAGE + B_STAGE)
#define C_LD (BN + 4)

""" + CP_ASYNC_SRC + r"""
""" + TF32X3_SRC + r"""
#if SPLITS > 1
""" + CLUSTER_SRC + CLUSTER_SUM_SRC + r"""#define CLUSTER_DIMS __cluster_dims__(1, 1, SPLITS)
#else
#define CLUSTER_DIMS
#endif

// One operand's k-tile into shared memory S (row stride LD): EXT rows or columns of it
// (along M for A, N for B) from e0, k from k0; chunks past elimit or kend are zero-filled
// (cp.async with source size 0). G(e, k) is G[e * ld + k] (KMAJOR) or G[k * ld + e].
template <int KMAJOR, int EXT, int LD>
__device__ __forceinline__ void load_operand(float* S, const float* __restrict__ G, long long ld,
                                             int e0, int elimit, int k0, int kend) {
#pragma unroll
    for (int c = threadIdx.x; c < EXT * BK / 4; c += THREADS) {
        const int r = KMAJOR ? c / (BK / 4) : c / (EXT / 4);  // the row of S
        const int q = 4 * (KMAJOR ? c % (BK / 4) : c % (EXT / 4));  // its first column
        const int e = e0 + (KMAJOR ? r : q), k = k0 + (KMAJOR ? q : r);
        const bool ok = e < elimit && k < kend;
        cp16(S + r * LD + q, ok ? G + (KMAJOR ? (long long)e * ld + k : (long long)k * ld + e) : G, ok);
    }
}
__device__ __forceinline__ void load_tile(float* smem, int st, const float* __restrict__ A,
                                          const float* __restrict__ B, int M, int N, int kend,
                                          long long lda, long long ldb, int m0, int n0, int k0) {
    float* As = smem + st * STAGE_FLOATS;
    load_operand<A_KMAJOR, BM, A_LD>(As, A, lda, m0, M, k0, kend);
    load_operand<B_KMAJOR, BN, B_LD>(As + A_STAGE, B, ldb, n0, N, k0, kend);
}

// C(M, N) = A(M, K) B(K, N), float32 in and out. A(m, k) at A[m * lda + k] (A_KMAJOR) or
// A[k * lda + m]; B(k, n) at B[n * ldb + k] (B_KMAJOR) or B[k * ldb + n]; C row-major, ldc.
// Grid (N / BN, M / BM, SPLITS); split z takes k in [z * kchunk, (z + 1) * kchunk).
extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(THREADS)
pipe_gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
          int M, int N, int K, long long lda, long long ldb, long long ldc, int kchunk) {
    extern __shared__ __align__(16) float smem[];
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int kbeg = blockIdx.z * kchunk;
    const int kend = min(K, kbeg + kchunk);
    const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane / 4, t = lane % 4;

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) load_tile(smem, s, A, B, M, N, kend, lda, ldb, m0, n0, kbeg + s * BK);
        cp_commit();
    }
    for (int kt = 0; kt < ntiles; ++kt) {
        cp_wait<STAGES - 2>();
        __syncthreads();  // tile kt landed for every thread; stage (kt - 1) % STAGES is free
        const int nt = kt + STAGES - 1;
        if (nt < ntiles) load_tile(smem, nt % STAGES, A, B, M, N, kend, lda, ldb, m0, n0,
                                   kbeg + nt * BK);
        cp_commit();
        const float* As = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* Bs = As + A_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned int ahi[MI][4], alo[MI][4], bhi[NJ][2], blo[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = wm * WTM + 16 * i + g;
#pragma unroll
                for (int q = 0; q < 4; ++q) {  // a[q] = A(r + 8 (q % 2), kk + t + 4 (q / 2))
                    const int rr = r + 8 * (q % 2), kq = kk + t + 4 * (q / 2);
#if A_KMAJOR
                    const float v = As[rr * A_LD + kq];
#else
                    const float v = As[kq * A_LD + rr];
#endif
                    split_tf32(v, ahi[i][q], alo[i][q]);
                }
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int n = wn * WTN + 8 * j + g;
#pragma unroll
                for (int q = 0; q < 2; ++q) {  // b[q] = B(kk + t + 4 q, n)
                    const int kq = kk + t + 4 * q;
#if B_KMAJOR
                    const float v = Bs[n * B_LD + kq];
#else
                    const float v = Bs[kq * B_LD + n];
#endif
                    split_tf32(v, bhi[j][q], blo[j][q]);
                }
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
#if PRODUCTS == 3
                    tf32_mma(acc[i][j], alo[i], bhi[j]);
                    tf32_mma(acc[i][j], ahi[i], blo[j]);
#endif
                    tf32_mma(acc[i][j], ahi[i], bhi[j]);
                }
        }
    }
    cp_wait<0>();

    // acc[i][j][q] = C(wm WTM + 16 i + g + 8 (q / 2), wn WTN + 8 j + 2 t + q % 2)
#if SPLITS > 1
    __syncthreads();  // every warp is done with the pipeline's shared memory
    float* Cs = smem;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * WTM + 16 * i + g + 8 * h, c = wn * WTN + 8 * j + 2 * t;
                *reinterpret_cast<float2*>(Cs + r * C_LD + c) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    cluster_sum_store<BM, BN, C_LD>(Cs, C, ldc, m0, n0, M, N);
#else
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = m0 + wm * WTM + 16 * i + g + 8 * h;
                const int c = n0 + wn * WTN + 8 * j + 2 * t;
                if (r < M && c < N)
                    *reinterpret_cast<float2*>(C + (long long)r * ldc + c) =
                        make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
#endif
}
"""

#: (BM, BN, WM, WN, BK, STAGES): block tile, warps along M and N, k-tile, pipeline depth.
TILES = [(64, 128, 2, 4, 32, 3), (64, 128, 2, 4, 16, 4), (128, 128, 4, 2, 32, 3),
         (64, 64, 2, 2, 32, 4), (128, 64, 4, 2, 32, 3), (32, 128, 1, 4, 32, 4)]
QUICK_TILES = TILES[:3]
SPLITS = (1, 2, 4, 8)


def _cdiv(a, b):
    return -(-a // b)


def source(bm, bn, wm, wn, bk, stages, a_kmajor, b_kmajor, splits, products):
    defines = dict(BM=bm, BN=bn, WM=wm, WN=wn, BK=bk, STAGES=stages, A_KMAJOR=a_kmajor,
                   B_KMAJOR=b_kmajor, SPLITS=splits, PRODUCTS=products)
    return "".join(f"#define {k} {int(v)}\n" for k, v in defines.items()) + SRC


def smem_bytes(bm, bn, bk, stages, a_kmajor, b_kmajor, splits):
    a = (bm if a_kmajor else bk) * ((bk + 4) if a_kmajor else (bm + 8))
    b = (bn if b_kmajor else bk) * ((bk + 4) if b_kmajor else (bn + 8))
    c = bm * (bn + 4) if splits > 1 else 0
    return 4 * max(stages * (a + b), c)


@functools.cache
def kernel(*key):
    import cupy as cp

    k = cp.RawKernel(source(*key), "pipe_gemm", options=("--std=c++17",))
    bm, bn, wm, wn, bk, stages, a_km, b_km, splits, _ = key
    k.max_dynamic_shared_size_bytes = smem_bytes(bm, bn, bk, stages, a_km, b_km, splits)
    return k


def launch(a, b, c, m, n, k, lda, ldb, a_kmajor, b_kmajor, tile, splits, products):
    """C = A B by the probe's kernel; A, B, C CuPy float32, strides as in ``SRC``."""
    bm, bn, wm, wn, bk, stages = tile
    chunk = _cdiv(_cdiv(k, splits), bk) * bk
    kern = kernel(bm, bn, wm, wn, bk, stages, a_kmajor, b_kmajor, splits, products)
    kern((_cdiv(n, bn), _cdiv(m, bm), splits), (32 * wm * wn,),
         (a, b, c, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(n), np.int32(chunk)),
         shared_mem=smem_bytes(bm, bn, bk, stages, a_kmajor, b_kmajor, splits))


def operands(op, batch, fin, fout, rng):
    """The layer's two float32 operands as the step has them, and the product's layout:
    ``(A_array, B_array, m, n, k, lda, ldb, a_kmajor, b_kmajor, a_mat, b_mat)`` with
    a_mat (m, k) and b_mat (k, n) the NumPy matrices of the product."""
    if op == "forward":   # y = x @ w.T: x (batch, fin) after a ReLU, w (fout, fin)
        x = np.maximum(rng.standard_normal((batch, fin)), 0).astype(np.float32)
        w = (rng.standard_normal((fout, fin)) / np.sqrt(fin)).astype(np.float32)
        return x, w, batch, fout, fin, fin, fin, 1, 1, x, w.T
    if op == "dgrad":     # dx = dy @ w: dy (batch, fin), w (fin, fout)
        dy = rng.standard_normal((batch, fin)).astype(np.float32)
        w = (rng.standard_normal((fin, fout)) / np.sqrt(fin)).astype(np.float32)
        return dy, w, batch, fout, fin, fin, fout, 1, 0, dy, w
    # dw = dy.T @ x: dy (batch, fout), x (batch, fin) after a ReLU
    dy = rng.standard_normal((batch, fout)).astype(np.float32)
    x = np.maximum(rng.standard_normal((batch, fin)), 0).astype(np.float32)
    return dy, x, fout, fin, batch, fout, fin, 0, 0, dy.T, x


def errors(got, ref, scale):
    d = np.abs(np.asarray(got, dtype=np.float64) - ref)
    return {"norm_rel": float(np.linalg.norm(d) / np.linalg.norm(ref)),
            "comp_max": float((d / np.maximum(scale, 1e-300)).max())}


def backends():
    """cuBLASLt's plain float32 product (``cublaslt_fp32``: before it turned the 3xTF32
    wgmma kernel off, the weight gradients' "cuBLASLt" product was the kernel's, call 200)
    and its TF32 product: the two references every probe here is timed against."""
    from fuseflow.backend.cuda_backend import CudaBackend

    return cublaslt_fp32(), CudaBackend(tf32=True, autotune=False)


class Case:
    """One of ``LAYERS``' products on the GPU: operands (``A``, ``B``) and layout as
    ``operands`` gives them, the float64 product ``ref`` of the same float32 numbers, the
    componentwise error scale ``scale`` (|A| |B|) and an output buffer ``C``."""

    def __init__(self, label, op, batch, fin, fout, rng):
        import cupy as cp

        a, b, m, n, k, lda, ldb, akm, bkm, amat, bmat = operands(op, batch, fin, fout, rng)
        self.label, self.op, self.m, self.n, self.k = label, op, m, n, k
        self.lda, self.ldb, self.akm, self.bkm = lda, ldb, akm, bkm
        self.ref = amat.astype(np.float64) @ bmat.astype(np.float64)
        self.scale = np.abs(amat).astype(np.float64) @ np.abs(bmat).astype(np.float64)
        self.A, self.B = cp.asarray(a), cp.asarray(b)
        self.C = cp.empty((m, n), dtype=cp.float32)

    def product(self, be):
        """The product by backend ``be``'s call for this op (a function of no arguments)."""
        A, B = self.A, self.B
        if self.op == "forward":
            return lambda: be.linear(A, B, None, "DEFAULT")[0]
        if self.op == "dgrad":
            return lambda: be.linear_dgrad(A, B, "DEFAULT", None)[0]
        return lambda: be.linear_wgrad(A, B, "DEFAULT")[0]

    def baseline(self, fp32, tf32, graph_us):
        """The case's JSON row, with cuBLASLt's float32 and TF32 errors and times."""
        import cupy as cp

        row = {"label": self.label, "op": self.op, "m": self.m, "n": self.n, "k": self.k}
        for name, be in (("fp32", fp32), ("tf32", tf32)):
            run = self.product(be)
            row[f"cublaslt_{name}_errors"] = errors(cp.asnumpy(run()), self.ref, self.scale)
            row[f"cublaslt_{name}_us"] = graph_us(run)
        row["variants"] = []
        return row

    def check_and_time(self, v, run, max_norm_rel, graph_us):
        """``run()`` (which writes ``C``) checked against the float64 product, then timed if
        within ``max_norm_rel``: its errors and ``us``, ``wrong`` or ``error`` into ``v``."""
        import cupy as cp

        try:
            self.C.fill(np.nan)
            run()
            v["errors"] = errors(cp.asnumpy(self.C), self.ref, self.scale)
            if not v["errors"]["norm_rel"] <= max_norm_rel:
                v["wrong"] = True
            else:
                v["us"] = graph_us(run)
        except Exception as e:  # noqa: BLE001 - record and go on
            v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return v


def failed(row):
    """The variants of ``row`` that were wrong or failed."""
    return [v for v in row["variants"] if "wrong" in v or "error" in v]


def profile_once(runs):
    """Each of ``runs`` once more inside the profiler's range (for ``ncu
    --profile-from-start off``), after a first call that compiles, plans and warms it."""
    import cupy as cp

    for run in runs:
        run()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    for run in runs:
        run()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def ncu_target(fp32, tf32, rng):
    c = Case(*LAYERS[1], rng)
    runs = [c.product(tf32), c.product(fp32)]
    runs += [functools.partial(launch, c.A, c.B, c.C, c.m, c.n, c.k, c.lda, c.ldb, c.akm, c.bkm,
                               (64, 64, 2, 2, 32, 4), 4, p) for p in (1, 3)]
    profile_once(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="three tiles, not six")
    ap.add_argument("--products", type=int, choices=(1, 3), nargs="+", default=[3])
    ap.add_argument("--name", default="tf32x3_pipe_probe")
    ap.add_argument("--ncu", action="store_true",
                    help="a target for Nsight Compute (--profile-from-start off): layer 2's "
                         "forward once by cuBLASLt in TF32 and float32, and by the kernel "
                         "(64 x 64 tile, 4 splits) with one and three products; no JSON")
    args = ap.parse_args()
    from skinny_sweep import graph_us

    fp32, tf32 = backends()
    rng = np.random.default_rng(0)
    if args.ncu:
        return ncu_target(fp32, tf32, rng)
    tiles = QUICK_TILES if args.quick else TILES
    rows = []
    for layer in LAYERS[:5]:
        c = Case(*layer, rng)
        row = c.baseline(fp32, tf32, graph_us)
        for products in args.products:
            for tile in tiles:
                for splits in SPLITS:
                    if _cdiv(_cdiv(c.k, splits), tile[4]) < 2 or tile[0] % splits:
                        continue
                    v = {"tile": list(tile), "splits": splits, "products": products,
                         "blocks": _cdiv(c.n, tile[1]) * _cdiv(c.m, tile[0]) * splits}
                    run = functools.partial(launch, c.A, c.B, c.C, c.m, c.n, c.k, c.lda, c.ldb,
                                            c.akm, c.bkm, tile, splits, products)
                    row["variants"].append(c.check_and_time(v, run, MAX_NORM_REL[products],
                                                            graph_us))
        timed = [v for v in row["variants"] if "us" in v and v["products"] == 3]
        if timed:
            best = min(timed, key=lambda v: v["us"])
            row["best_3xtf32"] = best
            row["speedup_best_vs_cublaslt"] = row["cublaslt_fp32_us"] / best["us"]
        bad = failed(row)
        print(f"{c.label:48s} cublaslt {row['cublaslt_fp32_us']:7.2f} us "
              f"(TF32 {row['cublaslt_tf32_us']:7.2f}) "
              f"(err {row['cublaslt_fp32_errors']['norm_rel']:.1e})"
              + (f"  best 3xTF32 {best['us']:7.2f} us {best['tile']} s={best['splits']} "
                 f"(err {best['errors']['norm_rel']:.1e})" if timed else "  no 3xTF32 timed")
              + f"  wrong/failed {len(bad)}", flush=True)
        for v in bad:
            print("   ", v, flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, f"{args.name}.json"),
               {"benchmark": "tf32x3_pipe_probe", **metadata("cupy", "nvmath"), "rows": rows,
                "note": "median GPU time per call: 20 calls in one CUDA graph; cublaslt = "
                        "the backend's plain float32 product, own matmul off"})


if __name__ == "__main__":
    main()
