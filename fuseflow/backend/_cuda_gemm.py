"""fuseflow's own full-float32 matmul for dense layers, with the epilog inside.

In full float32 (no TF32) cuBLASLt has only SIMT kernels, and at MNIST-scale shapes they
leave most of the GPU idle: on the H200 a 256 x 784 x 1024 layer ran a 64 x 64 tile kernel
in 64 blocks, plus a split-K reduction kernel, plus fuseflow's bias/ReLU pass (three
launches, 17-21 us, 20-25 TFLOP/s), and the five such matmuls of a 784-1024-1024-10 step
took 90 of its 122 us. This kernel is the textbook register-blocked SIMT GEMM (each thread
an 8 x 8 block of C from double-buffered shared-memory tiles, 16-byte loads) that fills
the GPU by splitting K across blocks, and ends in one launch:

- split-K partials go to a workspace; the block that arrives last at its tile
  (``_cuda_tickets``) adds them in split order (deterministic) and runs the epilog; or,
  with ``cluster=True``, the splits of a tile form a thread-block cluster that adds them
  through distributed shared memory, each block the sums and epilog of a share of the rows;
- forward epilog: ``y = act(acc + bias)`` and the relu_aux bits (cuBLASLt's layout, see
  ``epilogs.py``; the same arithmetic as ``_cuda_epilogs.bias_relu``);
- input-gradient epilog: the ReLU mask of the layer below and, with BGRAD, its bias
  gradient (column sums per row tile, then added in tile order by the last tile of the
  column strip);
- weight gradient: the plain product (K, the batch, split like any other).

The inner product (``MMAS``) is SIMT float32 FMAs by default; ``mma="f64"`` runs it on the
float64 tensor cores instead and hands the rounded sums to the same split and epilog code
(measured no faster, see ``MMAS``); ``mma="tf32x3"`` runs it on the TF32 tensor cores as
3xTF32 (CUTLASS's float32 emulation), about 21 bits of each operand in three products
(as accurate as float32, measured no faster either).

Operands are addressed as A(m, k) and B(k, n) with one stride 1, so the three products of a
dense layer (``x @ w.T``, ``dy @ w``, ``dy.T @ x``) need no transposed copies. Float32
only, 16-byte aligned operands, the contiguous extents multiples of 4 (``supported``).
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow.backend import _cuda_tickets as T

#: Blocks a matmul is split into (tiles x K splits), about one per SM of the H200 (132):
#: a constant, so that the split, and with it the order of the sums, depends on the shapes
#: alone and not on the GPU.
TARGET_BLOCKS = 132
MIN_K_PER_SPLIT = 64
#: k per shared-memory tile: 16 gives each warp 1024 FMAs between loads (8 and 16 measured
#: within 2-6% of each other at the medium model's shapes, ``gemm_sweep.json``).
BK = 16
#: ``CudaBackend.own_gemm_max_macs``'s default: off. Measured on the H200
#: (``benchmarks/gemm_sweep.py``, ``gemm_sweep.json``) this kernel is slower than cuBLASLt's
#: SIMT kernels plus their reduction and epilog passes at every shape of the medium model
#: (22.6 vs 18.3 us for 256 x 784 x 1024 with bias/ReLU, 22.9 vs 16.1 us for the 1024 x 1024
#: weight gradient), under every tile shape, K split (1-12, added by the last block or in
#: a cluster) and k-tile depth swept. Nsight Compute (``session13_ncu_*.log``) says why: at
#: 8 x 8 outputs per thread a 256 x 1024 output is about one warp per SM, and one warp per
#: scheduler stalls on its own dependencies (37% of issue slots busy, cuBLASLt's kernel
#: 63% with three warps per scheduler); more warps need more K splits, whose sums then
#: cost what the warps gain. It stays for experiments (``FUSEFLOW_OWN_GEMM_MAX_MACS``).
DEFAULT_MAX_MACS = 0
WARPS = (2, 2)  # warps along M and N: a 64 x 128 tile, 128 threads
#: How the inner product runs: "simt" (fp32 FMAs, each thread an 8 x 8 block) or "f64"
#: (the float64 tensor cores, ``mma.m16n8k*``, each warp a 32 x 64 block of float64 sums
#: of the float32 operands, rounded to float32 once at the end). Measured on the H200
#: (``gemm_sweep.py --mma f64``, ``session17_s17b/gemm_sweep_dmma.json``): at its best
#: launch each of the medium model's matmuls about as fast as the cuBLASLt path, and the
#: compiled medium steps equal to it, not faster. ``gemm_kscan.py`` (``session18_s18c``)
#: says where the time goes, the same for both inner products: 1.14-1.16 us per 16 of K in
#: a block with one warp per scheduler (about 45% of either pipe's peak), 4.0 us fixed per
#: launch and 4.6 us more with 4 K splits. Staging the tiles as float64 in shared memory
#: (no conversion per fragment) measured no faster (``session18_s18b``). docs/gpu.md.
#: "tf32x3" runs it on the TF32 tensor cores as 3xTF32 (each operand split into two TF32
#: numbers, three products of them), each k-tile summed there and added to float32
#: accumulators with round-to-nearest. Measured on an H100 (calls 129-131,
#: ``tf32x3_probe.py``, ``gemm_sweep.py``): as accurate as float32 FMAs against float64
#: (norm-relative 1.5-2.0e-7, cuBLASLt's float32 1.5-5.8e-7, TF32 2.9e-4), but no faster:
#: the medium model's matmuls 15.1-24.3 us at their best launches against cuBLASLt's
#: 15.3-21.4, the compiled medium steps 4% and the large full-float32 ones 4-5% slower.
#: As in CUTLASS's 3xTF32, an infinite operand (or one within 2^-12 of float32's largest,
#: whose TF32 rounding overflows) gives NaN, where float32 FMAs give an infinity.
MMAS = ("simt", "f64", "tf32x3")
_MMA_NAMES = {"f64": "float64", "tf32x3": "3xTF32"}
MMA = "simt"
#: k of the float64 tensor cores' ``mma.m16n8k*`` shape (4, 8 or 16; the k-tile a multiple).
DMMA_KS = (4, 8, 16)
DMMA_K = 16
#: The most blocks of a cluster that every GPU of compute capability 9.0 runs (portable).
MAX_CLUSTER = 8

#: A thread-block cluster's barrier and its reads of a peer block's shared memory (also
#: the cluster sums of ``benchmarks/tf32x3_pipe_probe.py``).
CLUSTER_SRC = r"""
// Every thread of every block of the cluster arrives; shared-memory writes before it are
// visible to the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// 16 bytes at ``p`` (this block's shared memory) in the shared memory of cluster block ``rank``.
__device__ __forceinline__ float4 load_peer(const float* p, unsigned int rank) {
    const unsigned int local = (unsigned int)__cvta_generic_to_shared(p);
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
    return v;
}
"""

#: 3xTF32's operand split and its TF32 tensor-core product (also the probe's).
TF32X3_SRC = r"""
// 3xTF32 (CUTLASS's "fast accurate" float32 on the TF32 tensor cores): each float32 operand
// is split into x = hi + lo, hi = x rounded to TF32 (10 explicit mantissa bits), lo = the
// rest (exact in float32) rounded to TF32, so hi + lo carries 21-22 bits of x; a product is
// lo_a hi_b + hi_a lo_b + hi_a hi_b (lo_a lo_b, about 2^-22 of it, is dropped), all three
// added to a k-tile's float32 sums by mma.m16n8k8.tf32, whose fragments sit where the
// float64 m16n8k8's do: a[i] = A(g + 8 (i % 2), t + 4 (i / 2)), b[i] = B(t + 4 i, g),
// d[i] = D(g + 8 (i / 2), 2 t + i % 2) (PTX ISA, "Matrix Fragments for mma.m16n8k8").
__device__ __forceinline__ void split_tf32(float x, unsigned int& hi, unsigned int& lo) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    hi &= 0xffffe000u;  // the TF32 bits alone (PTX leaves the low 13 unspecified), so the
                        // difference below is x's exact remainder
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}
__device__ __forceinline__ void tf32_mma(float (&d)[4], const unsigned int (&a)[4],
                                         const unsigned int (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""

_SRC = r"""
#define BM (32 * WM)
#define BN (64 * WN)
#define THREADS (32 * WM * WN)
// F64MMA and TF32X3 read their fragments as S[k0 + lane % 4][r0 + lane / 4]: rows 8 floats
// apart mod 32 keep the four k of a fragment in different banks.
#define FRAG_MMA (F64MMA || TF32X3)
#define APAD (FRAG_MMA ? 8 : (A_KMAJOR ? 4 : 0))
#define BPAD (FRAG_MMA ? 8 : (B_KMAJOR ? 4 : 0))
#define A4 (BM * BK / 4)
#define B4 (BN * BK / 4)
#define LA ((A4 + THREADS - 1) / THREADS)
#define LB ((B4 + THREADS - 1) / THREADS)
#define AS_FLOATS (2 * BK * (BM + APAD))
#define PIPE_FLOATS (AS_FLOATS + 2 * BK * (BN + BPAD))
// With CLUSTER > 1 the K splits of a tile form a thread-block cluster that adds its
// partials through distributed shared memory, and F64MMA and TF32X3 stage their
// accumulators into the SIMT layout: both reuse the pipeline's shared memory for the tile.
#define PART_FLOATS ((CLUSTER > 1 || FRAG_MMA) ? BM * BN : 0)
#define SMEM_FLOATS (PIPE_FLOATS > PART_FLOATS ? PIPE_FLOATS : PART_FLOATS)
// The blocks of a tile that finish it: one (no cluster: the last split to arrive, or the
// only one), else every block of the cluster, rank z taking rows i of each thread's 8 x 8
// block with i % CLUSTER == z. The cluster spans the grid's z axis, so the rank is blockIdx.z.
#define FINISHERS (CLUSTER > 1 ? CLUSTER : 1)
#define FINISHER_RANK (CLUSTER > 1 ? (int)blockIdx.z : 0)
#define FINISHES_ROW(i) ((i) % FINISHERS == FINISHER_RANK)
#if CLUSTER > 1
#define CLUSTER_DIMS __cluster_dims__(1, 1, CLUSTER)
""" + CLUSTER_SRC + r"""#else
#define CLUSTER_DIMS
#endif

#if F64MMA
// d += a @ b on the FP64 tensor cores, one m16n8k(DMMA_K) tile (Hopper's shapes): lane
// (g, t) = (lane / 4, lane % 4) holds a[i] = A(g + 8 (i % 2), t + 4 (i / 2)),
// b[i] = B(t + 4 i, g) and d[i] = D(g + 8 (i / 2), 2 t + i % 2) (PTX ISA, checked on the
// H200 by benchmarks/dmma_probe.py).
#define FA (DMMA_K / 2)
#define FB (DMMA_K / 4)
__device__ __forceinline__ void dmma(double (&d)[4], const double (&a)[FA], const double (&b)[FB]) {
#if DMMA_K == 4
    asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a[0]), "d"(a[1]), "d"(b[0]));
#elif DMMA_K == 8
    asm("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
          "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#endif
}
#endif

#if TF32X3
""" + TF32X3_SRC + r"""#endif

// Quads (16 bytes) of an operand tile of R rows (BM or BN) by BK: P(r, k) is P[r * ld + k]
// (KMAJOR) or P[k * ld + r]; zeros past rend rows and kend. L quads per thread. Where each
// of the thread's quads sits is worked out once, before the main loop: with one warp per
// scheduler nothing hides the index arithmetic, bounds checks and branches of a per-tile
// recomputation (they had the k-tile's non-FMA instructions stall 775 cycles against its
// 1,024 FMAs). A k-tile is then a pointer offset and a predicated load per quad.
template <int KMAJOR, int R, int L>
struct TileLoader {
    const float* p[L];  // the quad in the next k-tile to load
    int kq[L];          // its k offset within a k-tile
    bool in[L];         // it exists and its row is inside the matrix
    long long step;     // elements from one k-tile to the next
    __device__ __forceinline__ TileLoader(const float* __restrict__ P, long long ld, int r0,
                                          int rend, int kbeg) {
        step = KMAJOR ? (long long)BK : (long long)BK * ld;
        #pragma unroll
        for (int l = 0; l < L; ++l) {
            const int f = threadIdx.x + l * THREADS;
            const int r = r0 + (KMAJOR ? f / (BK / 4) : (f % (R / 4)) * 4);
            const int k = KMAJOR ? (f % (BK / 4)) * 4 : f / (R / 4);
            kq[l] = k;
            in[l] = ((R * BK / 4) % THREADS == 0 || f < R * BK / 4) && r < rend;
            p[l] = P + (KMAJOR ? (long long)r * ld + kbeg + k : (long long)(kbeg + k) * ld + r);
        }
    }
    // The next k-tile, of which kleft k remain (all BK but in the last, partial one).
    __device__ __forceinline__ void load_next(float4 (&q)[L], int kleft) {
        #pragma unroll
        for (int l = 0; l < L; ++l) {
            const bool ok = in[l] && (kleft >= BK || kq[l] < kleft);
            q[l] = ok ? __ldg(reinterpret_cast<const float4*>(p[l]))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
            p[l] += step;
        }
    }
};

// The tile into shared memory as S[k][r]: k-major quads transposed, the others as they are.
template <int KMAJOR, int R, int PAD, int L>
__device__ __forceinline__ void store_tile(float (*S)[R + PAD], const float4 (&q)[L]) {
    #pragma unroll
    for (int l = 0; l < L; ++l) {
        const int f = threadIdx.x + l * THREADS;
        if ((R * BK / 4) % THREADS == 0 || f < R * BK / 4) {
            if (KMAJOR) {
                const int r = f / (BK / 4), kq = (f % (BK / 4)) * 4;
                S[kq][r] = q[l].x; S[kq + 1][r] = q[l].y;
                S[kq + 2][r] = q[l].z; S[kq + 3][r] = q[l].w;
            } else {
                *reinterpret_cast<float4*>(&S[f / (R / 4)][(f % (R / 4)) * 4]) = q[l];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS simt_gemm(
        const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
        const float* __restrict__ bias, unsigned char* __restrict__ aux_out,
        const unsigned char* __restrict__ aux_in, float* __restrict__ ws,
        float* __restrict__ colpart, float* __restrict__ db, unsigned int* __restrict__ cnt,
        int M, int N, int K, long long lda, long long ldb, long long ldc, long long ld_aux,
        int aux_rows, int kchunk) {
    __shared__ __align__(16) float smem[SMEM_FLOATS];
    float (*As)[BK][BM + APAD] = reinterpret_cast<float (*)[BK][BM + APAD]>(smem);
    float (*Bs)[BK][BN + BPAD] = reinterpret_cast<float (*)[BK][BN + BPAD]>(smem + AS_FLOATS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN, tm = lane >> 3, tn = lane & 7;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int kbeg = blockIdx.z * kchunk;
    const int kend = min(K, kbeg + kchunk);
    const int rbase = wm * 32 + tm * 4, cbase = wn * 64 + tn * 4;
    float4 ra[LA], rb[LB];

    float acc[8][8];
#if F64MMA
    // The warp's 32 x 64 block as 2 x 8 m16n8 tiles of float64 sums (products of float32
    // numbers are exact in float64).
    double dacc[2][8][4];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) dacc[i][j][e] = 0.0;
        }
    }
    const int fg = lane >> 2, ft = lane & 3;
#elif TF32X3
    // The warp's 32 x 64 block as 2 x 8 m16n8 tiles of float32 sums.
    float tacc[2][8][4];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) tacc[i][j][e] = 0.f;
        }
    }
    const int fg = lane >> 2, ft = lane & 3;
#else
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    }
#endif
    const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
    TileLoader<A_KMAJOR, BM, LA> aload(A, lda, m0, M, kbeg);
    TileLoader<B_KMAJOR, BN, LB> bload(B, ldb, n0, N, kbeg);
    if (ntiles > 0) {
        aload.load_next(ra, kend - kbeg);
        bload.load_next(rb, kend - kbeg);
        store_tile<A_KMAJOR, BM, APAD>(As[0], ra);
        store_tile<B_KMAJOR, BN, BPAD>(Bs[0], rb);
    }
    __syncthreads();
    for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) {
            aload.load_next(ra, kend - kbeg - (t + 1) * BK);
            bload.load_next(rb, kend - kbeg - (t + 1) * BK);
        }
#if F64MMA
        #pragma unroll
        for (int kk = 0; kk < BK; kk += DMMA_K) {
            double a[2][FA];
            #pragma unroll
            for (int i = 0; i < 2; ++i) {
                #pragma unroll
                for (int q = 0; q < FA; ++q)
                    a[i][q] = (double)As[cur][kk + ft + 4 * (q / 2)]
                                            [wm * 32 + 16 * i + 8 * (q % 2) + fg];
            }
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                double b[FB];
                #pragma unroll
                for (int q = 0; q < FB; ++q)
                    b[q] = (double)Bs[cur][kk + ft + 4 * q][wn * 64 + 8 * j + fg];
                #pragma unroll
                for (int i = 0; i < 2; ++i) dmma(dacc[i][j], a[i], b);
            }
        }
#elif TF32X3
        // The tensor cores add with truncation: summed over one k-tile here and added to
        // the accumulators with round-to-nearest, the truncated sums stay k-tile sized
        // (summed in the accumulators, the products' error was 7-12x float32's, call 129).
        float part[2][8][4];
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) part[i][j][e] = 0.f;
            }
        }
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned int ahi[2][4], alo[2][4];
            #pragma unroll
            for (int i = 0; i < 2; ++i) {
                #pragma unroll
                for (int q = 0; q < 4; ++q)
                    split_tf32(As[cur][kk + ft + 4 * (q / 2)][wm * 32 + 16 * i + 8 * (q % 2) + fg],
                               ahi[i][q], alo[i][q]);
            }
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                unsigned int bhi[2], blo[2];
                #pragma unroll
                for (int q = 0; q < 2; ++q)
                    split_tf32(Bs[cur][kk + ft + 4 * q][wn * 64 + 8 * j + fg], bhi[q], blo[q]);
                #pragma unroll
                for (int i = 0; i < 2; ++i) {  // the small terms first
                    tf32_mma(part[i][j], alo[i], bhi);
                    tf32_mma(part[i][j], ahi[i], blo);
                    tf32_mma(part[i][j], ahi[i], bhi);
                }
            }
        }
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) tacc[i][j][e] += part[i][j][e];
            }
        }
#else
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][rbase]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][rbase + 16]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][cbase]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][cbase + 32]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
#endif
        if (t + 1 < ntiles) {
            store_tile<A_KMAJOR, BM, APAD>(As[cur ^ 1], ra);
            store_tile<B_KMAJOR, BN, BPAD>(Bs[cur ^ 1], rb);
        }
        __syncthreads();
    }

    // Row i of the thread's block is rbase + i (i < 4) or rbase + 12 + i; column j is
    // cbase + j (j < 4) or cbase + 28 + j.
#if FRAG_MMA
    // (F64MMA: rounded to float32 and) moved to that layout through the warp's part of the
    // tile in shared memory (free after the loop's last barrier); what follows is the SIMT
    // kernel's.
#if F64MMA
#define FRAG_ACC(i, j, e) ((float)dacc[i][j][e])
#else
#define FRAG_ACC(i, j, e) (tacc[i][j][e])
#endif
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(smem + (wm * 32 + 16 * i + 8 * h + fg) * BN +
                                           wn * 64 + 8 * j + 2 * ft) =
                    make_float2(FRAG_ACC(i, j, 2 * h), FRAG_ACC(i, j, 2 * h + 1));
        }
    }
    __syncwarp();
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int rl = rbase + (i < 4 ? i : 12 + i);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float4 v = *reinterpret_cast<const float4*>(smem + rl * BN + cbase + 32 * h);
            acc[i][4 * h] = v.x; acc[i][4 * h + 1] = v.y;
            acc[i][4 * h + 2] = v.z; acc[i][4 * h + 3] = v.w;
        }
    }
    __syncwarp();
#endif
    const int tiles = gridDim.x * gridDim.y;
#if CLUSTER > 1
    // The cluster's blocks are the tile's K splits. Each puts its accumulators in its shared
    // memory (free after the loop's last barrier); after the cluster barrier, block z adds
    // rows i = z, z + CLUSTER, ... of every thread's 8 x 8 block from all CLUSTER blocks, in
    // rank order (the same sums whichever block finishes first), and runs their epilog.
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int rl = rbase + (i < 4 ? i : 12 + i);
        *reinterpret_cast<float4*>(smem + rl * BN + cbase) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *reinterpret_cast<float4*>(smem + rl * BN + cbase + 32) =
            make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
    cluster_sync();
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (!FINISHES_ROW(i)) continue;
        const int rl = rbase + (i < 4 ? i : 12 + i);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float* at = smem + rl * BN + cbase + 32 * h;
            float4 sum = load_peer(at, 0u);
            for (unsigned int z = 1; z < CLUSTER; ++z) {
                const float4 v = load_peer(at, z);
                sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
            }
            acc[i][4 * h] = sum.x; acc[i][4 * h + 1] = sum.y;
            acc[i][4 * h + 2] = sum.z; acc[i][4 * h + 3] = sum.w;
        }
    }
    cluster_sync();  // no block leaves while another still reads its shared memory
#endif
    if (SPLIT) {
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        float* mine = ws + ((long long)tile * gridDim.z + blockIdx.z) * (BM * BN);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int rl = rbase + (i < 4 ? i : 12 + i);
            *reinterpret_cast<float4*>(mine + rl * BN + cbase) =
                make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            *reinterpret_cast<float4*>(mine + rl * BN + cbase + 32) =
                make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
        }
        if (!last_arrival(cnt + tile, gridDim.z)) return;
        // The last block adds the splits' partials in split order (its own read back too,
        // so the order does not depend on which block came last); each split's 16 loads
        // are in flight together.
        const float* all = ws + (long long)tile * gridDim.z * (BM * BN);
        for (int z = 0; z < (int)gridDim.z; ++z) {
            const float* pz = all + (long long)z * (BM * BN);
            float4 p[8][2];
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int rl = rbase + (i < 4 ? i : 12 + i);
                #pragma unroll
                for (int h = 0; h < 2; ++h)
                    p[i][h] = __ldcg(
                        reinterpret_cast<const float4*>(pz + rl * BN + cbase + 32 * h));
            }
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (z == 0) {
                        acc[i][4 * h] = p[i][h].x; acc[i][4 * h + 1] = p[i][h].y;
                        acc[i][4 * h + 2] = p[i][h].z; acc[i][4 * h + 3] = p[i][h].w;
                    } else {
                        acc[i][4 * h] += p[i][h].x; acc[i][4 * h + 1] += p[i][h].y;
                        acc[i][4 * h + 2] += p[i][h].z; acc[i][4 * h + 3] += p[i][h].w;
                    }
                }
            }
        }
    }

    float cs[8];
    #pragma unroll
    for (int j = 0; j < 8; ++j) cs[j] = 0.f;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (!FINISHES_ROW(i)) continue;
        const int r = m0 + rbase + (i < 4 ? i : 12 + i);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = n0 + cbase + 32 * h;
            const bool ok = r < M && c < N;  // N % 4 == 0: the 4 columns are all in or out
            float v[4] = {acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2],
                          acc[i][4 * h + 3]};
            unsigned int bits = 0u;
            if (ok) {
                if (HAS_BIAS) {
                    const float4 bb = *reinterpret_cast<const float4*>(bias + c);
                    v[0] += bb.x; v[1] += bb.y; v[2] += bb.z; v[3] += bb.w;
                }
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    if (AUX_OUT && v[u] >= 0.f) bits |= 1u << u;
                    if (RELU && v[u] < 0.f) v[u] = 0.f;
                }
                if (DRELU) {
                    const unsigned int m =
                        (unsigned int)aux_in[(long long)r * ld_aux + (c >> 3)] >> (c & 7);
                    #pragma unroll
                    for (int u = 0; u < 4; ++u) if (!((m >> u) & 1u)) v[u] = 0.f;
                }
                *reinterpret_cast<float4*>(C + (long long)r * ldc + c) =
                    make_float4(v[0], v[1], v[2], v[3]);
                if (BGRAD) {
                    #pragma unroll
                    for (int u = 0; u < 4; ++u) cs[4 * h + u] += v[u];
                }
            }
            if (AUX_OUT) {  // two lanes' nibbles make one byte of 8 features
                const unsigned int other = __shfl_xor_sync(0xffffffffu, bits, 1);
                if (!(tn & 1) && ok) aux_out[(long long)r * aux_rows + (c >> 3)] =
                    (unsigned char)(bits | (other << 4));
            }
        }
    }
    // zero the padding bytes past the data (once per row tile: in a cluster, its first block;
    // else the one block of the K splits that got here)
    if (AUX_OUT && blockIdx.x == gridDim.x - 1 && FINISHER_RANK == 0) {
        const int used = (N + 7) / 8, pad = aux_rows - used;
        for (int e = tid; e < BM * pad; e += THREADS) {
            const int r = m0 + e / pad;
            if (r < M) aux_out[(long long)r * aux_rows + used + e % pad] = 0;
        }
    }
    if (BGRAD) {
        __shared__ float red[WM][BN];
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 8);
            cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 16);
        }
        if (tm == 0) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) red[wm][cbase + (j < 4 ? j : 28 + j)] = cs[j];
        }
        __syncthreads();
        // one partial per row tile (and, in a cluster, per block of it), added in order
        const int parts = gridDim.y * FINISHERS;
        const int mine = blockIdx.y * FINISHERS + FINISHER_RANK;
        for (int col = tid; col < BN; col += THREADS) {
            const int n = n0 + col;
            float s = red[0][col];
            #pragma unroll
            for (int w = 1; w < WM; ++w) s += red[w][col];
            if (n < N) {
                if (parts == 1) db[n] = s;
                else colpart[(long long)mine * N + n] = s;
            }
        }
        if (parts > 1 && last_arrival(cnt + tiles + blockIdx.x, parts)) {
            for (int col = tid; col < BN; col += THREADS) {
                const int n = n0 + col;
                if (n >= N) continue;
                float s = __ldcg(colpart + n);
                for (int y = 1; y < parts; ++y)
                    s += __ldcg(colpart + (long long)y * N + n);
                db[n] = s;
            }
        }
    }
}
"""


@functools.cache
def _kernel(a_kmajor, b_kmajor, wm, wn, bk=BK, **flags):
    defines = {"A_KMAJOR": a_kmajor, "B_KMAJOR": b_kmajor, "WM": wm, "WN": wn, "BK": bk,
               "HAS_BIAS": 0, "RELU": 0, "AUX_OUT": 0, "DRELU": 0, "BGRAD": 0, "SPLIT": 0,
               "CLUSTER": 0, "F64MMA": 0, "TF32X3": 0, "DMMA_K": DMMA_K,
               **flags}
    head = "".join(f"#define {k} {int(v)}\n" for k, v in defines.items())
    return cupy.RawKernel(head + T.TICKET_SRC + _SRC, "simt_gemm")


def _aligned(*arrays):
    return all(a is None or a.data.ptr % 16 == 0 for a in arrays)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(m: int, n: int, warps) -> tuple[int, int]:
    """``(column tiles, row tiles)`` of an (m, n) output: the grid's x and y."""
    return _cdiv(n, 64 * warps[1]), _cdiv(m, 32 * warps[0])


def splits_for(m: int, n: int, k: int, warps=WARPS, bk=BK) -> tuple[int, int]:
    """``(splits, k_per_split)``: K split so that tiles x splits is about ``TARGET_BLOCKS``,
    at least ``MIN_K_PER_SPLIT`` deep; k_per_split a multiple of the k-tile."""
    gx, gy = _tiles(m, n, warps)
    want = max(1, min(round(TARGET_BLOCKS / (gx * gy)), k // MIN_K_PER_SPLIT))
    return _chunked(k, want, bk)


def _chunked(k: int, splits: int, bk: int) -> tuple[int, int]:
    """``(splits, k_per_split)`` for about ``splits`` splits of whole k-tiles."""
    chunk = _cdiv(_cdiv(k, splits), bk) * bk
    return _cdiv(k, chunk), chunk


def tile_fits(warps) -> bool:
    """Whether a tile of ``warps`` fits in the 48 KiB of static shared memory with the
    bias-gradient row sums: what a cluster launch and the float64 tensor cores need."""
    wm, wn = warps
    return (32 * wm) * (64 * wn) + wm * 64 * wn <= 48 * 1024 // 4


def cluster_fits(warps, splits) -> bool:
    """Whether a tile of ``warps`` can add ``splits`` K splits in a cluster: at most
    ``MAX_CLUSTER`` blocks, whose accumulators fit (``tile_fits``)."""
    return splits <= MAX_CLUSTER and tile_fits(warps)


def _run(a, b, c, m, n, k, lda, ldb, *, a_kmajor, b_kmajor, bias=None, relu=False,
         aux_out=None, aux_rows=0, aux_in=None, ld_aux=0, db=None, warps=None, splits=None,
         bk=None, cluster=False, mma=None, dmma_k=None):
    wm, wn = warps or WARPS
    bk = bk or BK
    mma = mma or MMA
    dmma_k = dmma_k or DMMA_K
    if mma not in MMAS:
        raise ValueError(f"own matmul: mma must be one of {MMAS}, got {mma!r}")
    if mma != "simt" and not tile_fits((wm, wn)):
        raise ValueError(f"no {_MMA_NAMES[mma]} tensor-core launch for warps {(wm, wn)}: its "
                         f"tile must fit in 48 KiB of shared memory")
    if mma == "tf32x3" and bk % 8:
        raise ValueError(f"no tf32x3 launch with bk={bk}: the k-tile must be a multiple of "
                         f"the TF32 tensor cores' k of 8")
    if mma == "f64" and (dmma_k not in DMMA_KS or bk % dmma_k):
        raise ValueError(f"no float64 tensor-core launch with dmma_k={dmma_k} and bk={bk}: "
                         f"dmma_k must be one of {DMMA_KS} and divide bk")
    gx, gy = _tiles(m, n, (wm, wn))
    s, chunk = splits_for(m, n, k, (wm, wn), bk) if splits is None else _chunked(k, splits, bk)
    if cluster and not cluster_fits((wm, wn), s):
        raise ValueError(f"no cluster launch for warps {(wm, wn)} with {s} K splits: the tile "
                         f"must fit in 48 KiB of shared memory and splits be <= {MAX_CLUSTER}")
    in_cluster = cluster and s > 1
    by_last_block = s > 1 and not in_cluster  # the last split to arrive adds the others
    tiles = gx * gy
    ws = (cupy.empty(tiles * s * 32 * wm * 64 * wn, dtype=cupy.float32)
          if by_last_block else None)
    parts = gy * (s if in_cluster else 1)  # bias-gradient partials per column
    colpart = cupy.empty((parts, n), dtype=cupy.float32) if db is not None and parts > 1 else None
    cnt = T.counters(tiles + gx) if by_last_block or colpart is not None else None
    if aux_out is not None:
        ld_aux = aux_rows
    kern = _kernel(a_kmajor, b_kmajor, wm, wn, bk, HAS_BIAS=bias is not None, RELU=relu,
                   AUX_OUT=aux_out is not None, DRELU=aux_in is not None,
                   BGRAD=db is not None, SPLIT=by_last_block,
                   CLUSTER=s if in_cluster else 0, F64MMA=mma == "f64",
                   TF32X3=mma == "tf32x3",
                   DMMA_K=dmma_k if mma == "f64" else DMMA_K)
    null = np.uintp(0)
    kern((gx, gy, s), (32 * wm * wn,),
         (a, b, c, bias if bias is not None else null,
          aux_out if aux_out is not None else null, aux_in if aux_in is not None else null,
          ws if ws is not None else null, colpart if colpart is not None else null,
          db if db is not None else null, cnt if cnt is not None else null,
          np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb), np.int64(n),
          np.int64(ld_aux), np.int32(aux_rows), np.int32(chunk)))


_INT_MAX = 2 ** 31 - 1


def supported(*, m, n, k, kmajor_extents, arrays, max_macs) -> bool:
    """Whether the kernel runs this product: float32, 16-byte aligned, every contiguous
    extent (and N) a multiple of 4, int32 sizes, enough arrival counters."""
    if not (m and n and k) or m * n * k > max_macs or max(m, n, k) > _INT_MAX // 2:
        return False
    if n % 4 or any(e % 4 for e in kmajor_extents):
        return False
    if any(a.dtype != np.float32 for a in arrays if a is not None):
        return False
    gx, gy = _tiles(m, n, WARPS)
    return _aligned(*arrays) and gx * gy + gx <= T.SIZE


def forward_supported(x, w, bias, max_macs) -> bool:
    """y = x @ w.T for C-contiguous x (B, K), w (N, K)."""
    return supported(m=x.shape[0], n=w.shape[0], k=x.shape[1], kmajor_extents=(x.shape[1],),
                     arrays=(x, w, bias), max_macs=max_macs)


def dgrad_supported(dy, w, max_macs) -> bool:
    """dx = dy @ w for C-contiguous dy (B, N), w (N, F)."""
    return supported(m=dy.shape[0], n=w.shape[1], k=dy.shape[1],
                     kmajor_extents=(dy.shape[1],), arrays=(dy, w), max_macs=max_macs)


def wgrad_supported(dy, x, max_macs) -> bool:
    """dw = dy.T @ x for C-contiguous dy (B, N), x (B, F)."""
    return supported(m=dy.shape[1], n=x.shape[1], k=dy.shape[0],
                     kmajor_extents=(dy.shape[1],), arrays=(dy, x), max_macs=max_macs)


def forward(x, w, bias, *, relu: bool, aux_rows: int | None, **launch):
    """``(y, aux)``: ``act(x @ w.T + bias)``, aux the (aux_rows, B) column-major relu_aux
    when ``aux_rows`` is given. ``launch`` (``warps``, ``splits``, ``bk``, ``cluster``,
    ``mma``, ``dmma_k``) overrides the launch shape, for tests and benchmarks."""
    batch, k = x.shape
    n = w.shape[0]
    y = cupy.empty((batch, n), dtype=cupy.float32)
    aux = cupy.empty((batch, aux_rows), dtype=cupy.uint8) if aux_rows else None
    _run(x, w, y, batch, n, k, k, k, a_kmajor=1, b_kmajor=1, bias=bias, relu=relu,
         aux_out=aux, aux_rows=aux_rows or 0, **launch)
    return y, (aux.T if aux is not None else None)


def dgrad(dy, w, aux, ld: int, *, bgrad: bool, **launch):
    """``(dx, dbias)``: ``dy @ w`` masked by relu_aux ``aux`` (column b at byte ``b * ld``)
    when given, and with ``bgrad`` the column sums of the result."""
    batch, k = dy.shape
    features = w.shape[1]
    dx = cupy.empty((batch, features), dtype=cupy.float32)
    db = cupy.empty(features, dtype=cupy.float32) if bgrad else None
    _run(dy, w, dx, batch, features, k, k, features, a_kmajor=1, b_kmajor=0,
         aux_in=aux, ld_aux=ld, db=db, **launch)
    return dx, db


def wgrad(dy, x, **launch):
    """``dw = dy.T @ x`` (N, F) for dy (B, N), x (B, F)."""
    batch, n = dy.shape
    features = x.shape[1]
    dw = cupy.empty((n, features), dtype=cupy.float32)
    _run(dy, x, dw, n, features, batch, n, features, a_kmajor=0, b_kmajor=0, **launch)
    return dw
