"""Can a Hopper ``wgmma`` 3xTF32 matmul with float32-grade sums beat cuBLASLt's float32?

    python benchmarks/wgmma_probe.py --out DIR [--quick] [--products 1 3] [--cutlass-sums]
    python benchmarks/wgmma_probe.py --compile-only   # NVRTC, every variant, no GPU
    ncu --profile-from-start off ... python benchmarks/wgmma_probe.py --ncu

The pipelined ``mma.sync`` probe (``tf32x3_pipe_probe.py``, the fortieth session) was
slower than cuBLASLt's float32 SIMT kernels at all five medium-model products, and even one
TF32 product took it twice cuBLASLt's TF32 time, an sm90 ``wgmma`` kernel (benchmarks.md,
"What is left"). It also showed that summing 3xTF32's products straight in the tensor
cores' accumulators loses float32's accuracy over 784-1024-deep sums. This probe is the
kernel that section names next, standalone, before any of it goes into the backend:

- ``wgmma.mma_async`` (m64nNk8, TF32) by warpgroups along M (``WGM``) and N (``WGN``), both
  operands from shared memory in the unswizzled K-major layout (8 x 4 core matrices; the
  row-group and k-group strides are padded so that the split's stores spread over the banks);
- raw float32 k-tiles arrive by a ``STAGES``-deep ``cp.async`` pipeline; every thread
  splits the next tile into TF32 hi + lo (any operand layout: the store transposes) while
  the tensor cores work on the current one, into the other of two split stages;
- ``SUMS=1``: each k-tile's products go to fresh accumulators (``scale-d`` 0 on the
  first), which are added to the running sums with float32 round-to-nearest adds, so no
  sum is more than a k-tile deep in the tensor cores' truncating adder; ``SUMS=0`` sums
  everything in the tensor cores, as CUTLASS's 3xTF32 does (``--cutlass-sums``);
- ``CHOP=0``: the rounded split (hi and lo rounded to nearest TF32); ``CHOP=1``: hi = x's top 19
  bits and lo = the exact rest, two instructions a value instead of five;
- K split over the blocks of a thread-block cluster, added through distributed shared memory.

For each of the five matmuls of 784-1024-1024-10 at batch 256 (``tf32x3_pipe_probe``'s
operands): cuBLASLt's float32 and TF32 products, and this kernel over tiles, splits and
``MODES`` (one TF32 product, the kernel's ceiling; 3xTF32 with fresh sums, rounded and
chopped), each checked against the float64 product before it is timed (20 calls in one
CUDA graph, median over replays). Compiled by NVRTC for ``sm_90a`` (``wgmma`` needs the
architecture-specific target; CuPy's own compile path only targets ``sm_90``). Before the
sweep the probe finds which of the two readings of the descriptor's byte offsets is right
(``layout_swap``) and maps, on one tile, which reference element each output holds
(``fragment_check``), so a wrong layout is diagnosed from one run. JSON out.

Measured (calls 191-193, benchmarks.md "What is left"): fresh sums make 3xTF32 as
accurate as cuBLASLt's float32 (2.4-2.5e-7 against 1.6-2.9e-7); chopped (5.4e-7) it beat
cuBLASLt's float32 at all five products on the H200 by 1-13%; one TF32 product still took
1.7-2.6x cuBLASLt's TF32 time, instruction-bound on index arithmetic (Nsight Compute).
``Loader`` and ``Converter``, which work those offsets out once, came after call 193 and
have not run on a GPU.
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
from gemm_sweep import LAYERS  # noqa: E402
from tf32x3_pipe_probe import (  # noqa: E402
    CLUSTER_SUM_SRC, Case, backends, errors, failed, profile_once)

from fuseflow.backend._cuda_gemm import CLUSTER_SRC  # noqa: E402
from fuseflow.backend._cuda_wgmma import (  # noqa: E402
    CP_ASYNC_SRC, OPERAND_SRC, SPLIT_SRC, WGMMA_SYNC_SRC, compile_cubin, kgroup_bytes,
    load_kernel)

#: A variant more than this far from the float64 product (norm-relative) is wrong.
MAX_NORM_REL = {3: 2e-6, 1: 2e-3}
BK = 32
SMEM_MAX = 227 * 1024  # an H100's or H200's shared memory a block can opt into
SBO = 144  # bytes between row groups: 128 + 16 of padding (see ``kgroup_bytes``)

SRC = r"""
#define WGS (WGM * WGN)
#define THREADS (128 * WGS)
#define BM (64 * WGM)   // the block's rows: WGM warpgroups of 64
#define BNB (BN * WGN)  // the block's columns: WGN warpgroups of BN
#define NACC (BN / 2)
// Raw float32 k-tiles as cp.async lands them, rows padded by 4 floats (conflict-free reads;
// by 8 for an M-major A read as wgmma fragments, lanes (k t, row g) at banks 8 t + g).
#define A_RAW_LD (A_KMAJOR ? BK + 4 : BM + (AREG ? 8 : 4))
#define B_RAW_LD (B_KMAJOR ? BK + 4 : BNB + 4)
#define A_RAW ((A_KMAJOR ? BM : BK) * A_RAW_LD)
#define B_RAW ((B_KMAJOR ? BNB : BK) * B_RAW_LD)
#define RAW_STAGE (4 * (A_RAW + B_RAW))
// Split k-tiles in wgmma's layout: TF32 hi (and lo) of A, then of B.
#define A_TILE (AREG ? 0 : BK / 4 * A_KG)
#define B_TILE (BK / 4 * B_KG)
#define SPLIT_STAGE ((PRODUCTS == 3 ? 2 : 1) * (A_TILE + B_TILE))

""" + SPLIT_SRC + CP_ASYNC_SRC + WGMMA_SYNC_SRC + r"""// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r) :: "memory"); }

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, the
// byte offsets between core matrices along K (leading) and along M or N (stride), all in
// 16-byte units; no swizzle.
__device__ __forceinline__ unsigned long long descriptor(unsigned int addr, unsigned int kgroup,
                                                         unsigned int rgroup) {
#if SWAP
    const unsigned int lbo = rgroup, sbo = kgroup;
#else
    const unsigned int lbo = kgroup, sbo = rgroup;
#endif
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16)
         | ((unsigned long long)(sbo >> 4) << 32);
}
""" + "WGMMA_SRC" + r"""
#if SPLITS > 1
""" + CLUSTER_SRC + CLUSTER_SUM_SRC + r"""#define CLUSTER_DIMS __cluster_dims__(1, 1, SPLITS)
#else
#define CLUSTER_DIMS
#endif

""" + OPERAND_SRC + r"""
// C(M, N) = A(M, K) B(K, N), float32. A(m, k) at A[m * lda + k] (A_KMAJOR) or A[k * lda + m];
// B(k, n) at B[n * ldb + k] (B_KMAJOR) or B[k * ldb + n]; C row-major, ldc. Grid
// (N / BNB, M / BM, SPLITS); split z takes k in [z * kchunk, (z + 1) * kchunk).
// Shared memory: two split stages, then STAGES raw ones. Tile kt + 1 is split while the
// tensor cores work on tile kt; raw tiles arrive STAGES - 2 ahead of that.
extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(THREADS)
wg_gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
        int M, int N, int K, long long lda, long long ldb, long long ldc, int kchunk) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BNB;
    const int kbeg = blockIdx.z * kchunk;
    const int kend = min(K, kbeg + kchunk);
    const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
    const int wg = threadIdx.x / 128, wm = wg / WGN, wn = wg % WGN;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const unsigned int sbase = (unsigned int)__cvta_generic_to_shared(smem);
    float* raw = reinterpret_cast<float*>(smem + 2 * SPLIT_STAGE);
#define RAW_A(t) (raw + ((t) % STAGES) * (A_RAW + B_RAW))
#define RAW_B(t) (RAW_A(t) + A_RAW)
#define SPLIT(t) (smem + ((t) & 1) * SPLIT_STAGE)

    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
#if SUMS
    float fresh[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) fresh[i] = 0.f;
#define D fresh
#else
#define D acc
#endif
    const Loader<A_KMAJOR, BM, A_RAW_LD> load_a(A, lda, m0, M, kbeg);
    const Loader<B_KMAJOR, BNB, B_RAW_LD> load_b(B, ldb, n0, N, kbeg);
    const Converter<A_KMAJOR, BM, A_KG, A_RAW_LD> convert_a;
    const Converter<B_KMAJOR, BNB, B_KG, B_RAW_LD> convert_b;
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < ntiles) {
            load_a.load(RAW_A(t), t, kbeg + t * BK, kend, A);
            load_b.load(RAW_B(t), t, kbeg + t * BK, kend, B);
        }
        cp_commit();
    }
    cp_wait<STAGES - 2>();
    __syncthreads();
    if (ntiles > 0) {
        if (!AREG) convert_a.run(RAW_A(0), SPLIT(0), SPLIT(0) + A_TILE + B_TILE);
        convert_b.run(RAW_B(0), SPLIT(0) + A_TILE, SPLIT(0) + 2 * A_TILE + B_TILE);
    }
    fence_proxy_async();
    for (int kt = 0; kt < ntiles; ++kt) {
        cp_wait<STAGES - 3>();  // raw tile kt + 1 landed
        __syncthreads();        // ... for every thread; split tile kt written by every thread
        const int nt = kt + STAGES - 1;
        if (nt < ntiles) {      // into the raw stage of tile kt - 1, split two iterations ago
            load_a.load(RAW_A(nt), nt, kbeg + nt * BK, kend, A);
            load_b.load(RAW_B(nt), nt, kbeg + nt * BK, kend, B);
        }
        cp_commit();
        const unsigned int base = sbase + (kt & 1) * SPLIT_STAGE;
        const unsigned int bhi = base + A_TILE + wn * (BN / 8) * SBO;
#if !AREG
        const unsigned int ahi = base + wm * 8 * SBO;
#endif
#if PRODUCTS == 3
        const unsigned int blo = bhi + A_TILE + B_TILE;
#if !AREG
        const unsigned int alo = ahi + A_TILE + B_TILE;
#endif
#endif
#if AREG
        // A's fragments of tile kt, split in registers: a[v] = A(16 warp + lane / 4 + 8 (v % 2),
        // 8 k8 + lane % 4 + 4 (v / 2)) (CUTLASS's SM90 ALayout_64x8 for 32-bit types). They
        // stay untouched until the wgmma wait below (fence_operand there).
        unsigned int ah[BK / 8][4], al[BK / 8][4];
        {
            const float* ra = RAW_A(kt);
            const int r0 = wm * 64 + 16 * warp + lane / 4;
#pragma unroll
            for (int k8 = 0; k8 < BK / 8; ++k8)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const int r = r0 + 8 * (v % 2), k = 8 * k8 + lane % 4 + 4 * (v / 2);
                    split_tf32(ra[A_KMAJOR ? r * A_RAW_LD + k : k * A_RAW_LD + r], ah[k8][v],
                               al[k8][v]);
                }
        }
#endif
#pragma unroll
        for (int i = 0; i < NACC; ++i) fence_operand(D[i]);
        wgmma_fence();
#if AREG
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8) {  // k-groups 2 k8 and 2 k8 + 1
            const unsigned long long dbh = descriptor(bhi + 2 * k8 * B_KG, B_KG, SBO);
#if PRODUCTS == 3
            const unsigned long long dbl = descriptor(blo + 2 * k8 * B_KG, B_KG, SBO);
            wgmma_tf32_ra(D, al[k8], dbh, SUMS && k8 == 0 ? 0 : 1);  // small products first
            wgmma_tf32_ra(D, ah[k8], dbl, 1);
            wgmma_tf32_ra(D, ah[k8], dbh, 1);
#else
            wgmma_tf32_ra(D, ah[k8], dbh, SUMS && k8 == 0 ? 0 : 1);
#endif
        }
#else
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8) {  // k-groups 2 k8 and 2 k8 + 1
            const unsigned long long dah = descriptor(ahi + 2 * k8 * A_KG, A_KG, SBO);
            const unsigned long long dbh = descriptor(bhi + 2 * k8 * B_KG, B_KG, SBO);
#if PRODUCTS == 3
            const unsigned long long dal = descriptor(alo + 2 * k8 * A_KG, A_KG, SBO);
            const unsigned long long dbl = descriptor(blo + 2 * k8 * B_KG, B_KG, SBO);
            wgmma_tf32(D, dal, dbh, SUMS && k8 == 0 ? 0 : 1);  // small products first
            wgmma_tf32(D, dah, dbl, 1);
            wgmma_tf32(D, dah, dbh, 1);
#else
            wgmma_tf32(D, dah, dbh, SUMS && k8 == 0 ? 0 : 1);
#endif
        }
#endif
        wgmma_commit();
        if (kt + 1 < ntiles) {  // into the split stage tile kt - 1 used, waited for below
            unsigned char* sp = SPLIT(kt + 1);
            if (!AREG) convert_a.run(RAW_A(kt + 1), sp, sp + A_TILE + B_TILE);
            convert_b.run(RAW_B(kt + 1), sp + A_TILE, sp + 2 * A_TILE + B_TILE);
        }
        fence_proxy_async();
        wgmma_wait0();
#pragma unroll
        for (int i = 0; i < NACC; ++i) fence_operand(D[i]);
#if AREG
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                asm volatile("" : "+r"(ah[k8][v]) :: "memory");
                asm volatile("" : "+r"(al[k8][v]) :: "memory");
            }
#endif
#if SUMS
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[i] += fresh[i];  // float32, round to nearest
#endif
    }
    cp_wait<0>();

    // acc[4 j + q] = C(wm 64 + 16 warp + lane / 4 + 8 (q / 2), wn BN + 8 j + 2 (lane % 4) + q % 2)
#if SPLITS > 1
    __syncthreads();  // every warpgroup is done with the pipeline's shared memory
    float* Cs = reinterpret_cast<float*>(smem);
#define C_LD (BNB + 4)
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm * 64 + 16 * warp + lane / 4 + 8 * h, c = wn * BN + 8 * j + 2 * (lane % 4);
            *reinterpret_cast<float2*>(Cs + r * C_LD + c) = make_float2(acc[4 * j + 2 * h],
                                                                        acc[4 * j + 2 * h + 1]);
        }
    cluster_sum_store<BM, BNB, C_LD>(Cs, C, ldc, m0, n0, M, N);
#else
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = m0 + wm * 64 + 16 * warp + lane / 4 + 8 * h;
            const int c = n0 + wn * BN + 8 * j + 2 * (lane % 4);
            if (r < M && c < N)
                *reinterpret_cast<float2*>(C + (long long)r * ldc + c) =
                    make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
#endif
}
"""

#: (WGM, WGN, BN, STAGES): warpgroups along M (64 rows each) and along N (BN columns each),
#: raw pipeline depth.
TILES = [(1, 1, 32, 3), (1, 1, 32, 4), (1, 1, 64, 3), (1, 1, 64, 4), (1, 2, 32, 4),
         (1, 1, 128, 3), (1, 2, 64, 4), (2, 1, 64, 4), (2, 2, 64, 3)]
QUICK_TILES = [(1, 1, 64, 4), (1, 2, 32, 4), (1, 2, 64, 4)]
SPLITS = (1, 2, 4)
#: (products, sums, chop, areg): one TF32 product (the kernel's ceiling); 3xTF32 with fresh
#: per-k-tile sums, the rounded split or the chopped one; 3xTF32 summed in the tensor cores;
#: areg 1: A's fragments split in registers and fed to wgmma from there (no split stage for A).
MODES = [(1, 0, 0, 0), (3, 1, 0, 0), (3, 1, 1, 0), (3, 0, 0, 0),
         (1, 0, 0, 1), (3, 1, 0, 1), (3, 1, 1, 1)]


def _cdiv(a, b):
    return -(-a // b)


def wgmma_source(bn):
    """``wgmma_tf32(d, desc_a, desc_b, accumulate)``: D (+)= A B, m64 n``bn`` k8, TF32."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return (
        f"__device__ __forceinline__ void wgmma_tf32(float (&d)[{n}], unsigned long long da,\n"
        f"                                           unsigned long long db, int accumulate) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 "\n'
        f'                 "{{{regs}}}, %{n}, %{n + 1}, p, 1, 1;\\n}}\\n"\n'
        f'                 : {outs}\n'
        f'                 : "l"(da), "l"(db), "r"(accumulate));\n'
        f"}}\n"
        f"// The same with A's fragment in registers (AREG).\n"
        f"__device__ __forceinline__ void wgmma_tf32_ra(float (&d)[{n}], const unsigned int (&a)[4],\n"
        f"                                              unsigned long long db, int accumulate) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 5}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 "\n'
        f'                 "{{{regs}}}, {{%{n}, %{n + 1}, %{n + 2}, %{n + 3}}}, %{n + 4}, p, 1, 1;\\n}}\\n"\n'
        f'                 : {outs}\n'
        f'                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));\n'
        f"}}\n")


def source(tile, a_kmajor, b_kmajor, splits, products, sums, swap, chop=0, areg=0):
    wgm, wgn, bn, stages = tile
    defines = dict(WGM=wgm, WGN=wgn, BN=bn, STAGES=stages, BK=BK, SBO=SBO,
                   A_KG=kgroup_bytes(64 * wgm), B_KG=kgroup_bytes(bn * wgn),
                   A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, SPLITS=splits, PRODUCTS=products,
                   SUMS=sums, SWAP=swap, CHOP=chop, AREG=areg)
    return ("".join(f"#define {k} {int(v)}\n" for k, v in defines.items())
            + SRC.replace("WGMMA_SRC", wgmma_source(bn)))


def smem_bytes(tile, a_kmajor, b_kmajor, splits, products, areg=0):
    wgm, wgn, bn, stages = tile
    bm, bnb = 64 * wgm, bn * wgn
    split = ((2 if products == 3 else 1) * BK // 4
             * ((0 if areg else kgroup_bytes(bm)) + kgroup_bytes(bnb)))
    raw_a = bm * (BK + 4) if a_kmajor else BK * (bm + (8 if areg else 4))
    raw_b = bnb * (BK + 4) if b_kmajor else BK * (bnb + 4)
    c = 4 * bm * (bnb + 4) if splits > 1 else 0
    return max(2 * split + stages * 4 * (raw_a + raw_b), c)


@functools.cache
def kernel(*key):
    cubin, _ = compile_cubin(source(*key))
    return load_kernel(cubin, "wg_gemm", smem_bytes(*key[:5], areg=key[8]))


def launch(a, b, c, m, n, k, lda, ldb, a_kmajor, b_kmajor, tile, splits, products, sums, swap,
           chop=0, areg=0):
    """C = A B by the probe's kernel; A, B, C CuPy float32, strides as in ``SRC``."""
    wgm, wgn, bn, _ = tile
    chunk = _cdiv(_cdiv(k, splits), BK) * BK
    kern = kernel(tile, a_kmajor, b_kmajor, splits, products, sums, swap, chop, areg)
    kern((_cdiv(n, bn * wgn), _cdiv(m, 64 * wgm), splits), (128 * wgm * wgn,),
         (a, b, c, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(n), np.int32(chunk)),
         shared_mem=smem_bytes(tile, a_kmajor, b_kmajor, splits, products, areg))


def fragment_check(swap, rng):
    """On one 64 x 64 x 32 tile (k-major A, n-major B, 3xTF32, fresh sums): for each output,
    the reference element it matches best, and how many sit where they should (with
    float32-grade errors the best match is unambiguous)."""
    import cupy as cp

    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 64)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = cp.full((64, 64), np.nan, dtype=cp.float32)
    launch(cp.asarray(a), cp.asarray(b), c, 64, 64, 32, 32, 64, 1, 0, (1, 1, 64, 4), 1, 3, 1,
           swap)
    got = cp.asnumpy(c).astype(np.float64)
    flat = ref.ravel()
    where = np.abs(got.ravel()[:, None] - flat[None, :]).argmin(axis=1)
    right = where == np.arange(flat.size)
    return {"swap": swap, "errors": errors(got, ref, np.abs(a) @ np.abs(b)),
            "in_place": int(right.sum()), "of": int(flat.size),
            "nan": int(np.isnan(got).sum()),
            "first_misplaced": [[int(i) // 64, int(i) % 64, int(where[i]) // 64,
                                 int(where[i]) % 64] for i in np.flatnonzero(~right)[:16]]}


#: The launches ``--ncu`` profiles (layer 2's forward): one TF32 product, 3xTF32 chopped,
#: with A split in shared memory and in registers.
NCU_VARIANTS = [((1, 1, 64, 4), 2, 1, 0, 0, 0), ((1, 1, 64, 4), 2, 3, 1, 1, 0),
                ((1, 1, 64, 4), 2, 3, 1, 1, 1)]


def ncu_target(tf32, rng):
    """Layer 2's forward once by cuBLASLt in TF32 and by ``NCU_VARIANTS``, each compiled
    and warm before the profiled range (``ncu --profile-from-start off``)."""
    c = Case(*LAYERS[1], rng)
    runs = [c.product(tf32)]
    runs += [functools.partial(launch, c.A, c.B, c.C, c.m, c.n, c.k, c.lda, c.ldb, c.akm, c.bkm,
                               tile, splits, products, sums, 0, chop, areg)
             for tile, splits, products, sums, chop, areg in NCU_VARIANTS]
    profile_once(runs)


def compile_all(tiles):
    """Every variant the sweep can launch, compiled for sm_90a (no GPU needed)."""
    n = 0
    for tile in tiles:
        for akm in (0, 1):
            for bkm in (0, 1):
                for splits in SPLITS:
                    for products, sums, chop, areg in MODES:
                        _, log = compile_cubin(source(tile, akm, bkm, splits, products, sums, 0,
                                                      chop, areg), verbose=True)
                        n += 1
                        if "warning" in log.lower() or (akm, bkm, splits) == (1, 0, 1):
                            print(f"tile={tile} akm={akm} bkm={bkm} splits={splits} "
                                  f"products={products} sums={sums} chop={chop} areg={areg} "
                                  f"smem {smem_bytes(tile, akm, bkm, splits, products, areg)}\n"
                                  f"{log.strip()}", flush=True)
    print(f"compiled {n} variants", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="three tiles, not nine")
    ap.add_argument("--products", type=int, choices=(1, 3), nargs="+", default=[1, 3])
    ap.add_argument("--name", default="wgmma_probe")
    ap.add_argument("--cutlass-sums", action="store_true",
                    help="also sweep 3xTF32 with every product summed in the tensor cores")
    ap.add_argument("--ncu", action="store_true",
                    help="a target for Nsight Compute: layer 2's forward by cuBLASLt's TF32 "
                         "and NCU_VARIANTS, once each; no JSON")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile every variant with NVRTC (ptxas -v) and stop; no GPU needed")
    args = ap.parse_args()
    if not (args.out or args.compile_only or args.ncu):
        ap.error("--out DIR is needed for the sweep's JSON")
    tiles = QUICK_TILES if args.quick else TILES
    if args.compile_only:
        return compile_all(tiles)
    from skinny_sweep import graph_us

    fp32, tf32 = backends()
    rng = np.random.default_rng(0)
    if args.ncu:
        return ncu_target(tf32, rng)
    checks = [fragment_check(swap, rng) for swap in (0, 1)]
    for ch in checks:
        print("fragment check", ch, flush=True)
    good = [ch["swap"] for ch in checks if ch["errors"]["norm_rel"] < 1e-5]
    swap = good[0] if good else 0
    modes = [md for md in MODES if md[0] in args.products
             and (args.cutlass_sums or md[1] or md[0] == 1)]
    rows = []
    for layer in LAYERS[:5]:
        c = Case(*layer, rng)
        row = c.baseline(fp32, tf32, graph_us)
        for products, sums, chop, areg in modes:
            for tile in tiles:
                for splits in SPLITS:
                    smem = smem_bytes(tile, c.akm, c.bkm, splits, products, areg)
                    if (_cdiv(_cdiv(c.k, splits), BK) < 2 or (64 * tile[0]) % splits
                            or smem > SMEM_MAX):
                        continue
                    v = {"tile": list(tile), "splits": splits, "products": products,
                         "sums": sums, "chop": chop, "areg": areg, "smem": smem,
                         "blocks": _cdiv(c.n, tile[1] * tile[2]) * _cdiv(c.m, 64 * tile[0]) * splits}
                    run = functools.partial(launch, c.A, c.B, c.C, c.m, c.n, c.k, c.lda, c.ldb,
                                            c.akm, c.bkm, tile, splits, products, sums, swap, chop,
                                            areg)
                    row["variants"].append(c.check_and_time(v, run, MAX_NORM_REL[products],
                                                            graph_us))
        summary = []
        for products, sums, chop, areg in modes:
            timed = [v for v in row["variants"] if "us" in v and v["products"] == products
                     and v["sums"] == sums and v["chop"] == chop and v["areg"] == areg]
            if timed:
                best = min(timed, key=lambda v: v["us"])
                tag = f"p{products}s{sums}c{chop}r{areg}"
                row[f"best_{tag}"] = best
                summary.append(f"{tag} {best['us']:6.2f} {best['tile']} "
                               f"x{best['splits']} ({best['errors']['norm_rel']:.1e})")
        bad = failed(row)
        print(f"{c.label:44s} cublaslt {row['cublaslt_fp32_us']:6.2f} "
              f"({row['cublaslt_fp32_errors']['norm_rel']:.1e}) TF32 "
              f"{row['cublaslt_tf32_us']:6.2f} | " + " | ".join(summary)
              + f" | wrong/failed {len(bad)}", flush=True)
        for v in bad:
            print("   ", v, flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, f"{args.name}.json"),
               {"benchmark": "wgmma_probe", **metadata("cupy", "nvmath"), "layout_swap": swap,
                "fragment_check": checks, "rows": rows,
                "note": "median GPU time per call: 20 calls in one CUDA graph; cublaslt = "
                        "the backend's plain float32 product, own matmul off"})


if __name__ == "__main__":
    main()
