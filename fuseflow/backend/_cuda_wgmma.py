"""Full-float32-grade matmuls on Hopper's TF32 tensor cores: 3xTF32 by ``wgmma``.

In full float32 cuBLASLt has only SIMT kernels, and at the medium MLP's shapes (batch 256,
1024 features) its five products take about 80 us of a 108 us training step. This kernel
runs them as 3xTF32 (CUTLASS's float32 emulation: each operand split x = hi + lo into TF32
numbers, a product = lo_a hi_b + hi_a lo_b + hi_a hi_b) on ``wgmma.mma_async`` (sm_90a):

- raw float32 k-tiles of 32 arrive by a 4-stage ``cp.async`` pipeline; each thread's
  copy and split offsets are worked out once, before the main loop;
- A's fragments are split in registers and fed to ``wgmma`` from there; B's k-tile is
  split into TF32 hi and lo in shared memory (wgmma's K-major core-matrix layout, which
  TF32 requires: the split's stores transpose an N-major B) while the tensor cores work on
  the previous one;
- each k-tile's three products go to fresh accumulators that are then added to the running
  float32 sums with round-to-nearest, so no sum is more than 32 deep in the tensor cores'
  adder (summed there over all of K, as in CUTLASS, the error was 20-30x float32's);
- K may be split into slices whose partial products go to separate (M, N) planes, which
  the epilog pass (``_cuda_epilogs``) adds in slice order as it applies bias/ReLU or the
  ReLU mask (``CudaBackend._split_k``).

Errors against float64 (norm-relative, ``benchmarks/wgmma_probe.py`` and
``wgmma_splits.py``, calls 193-194 and 200): the rounded split 2.4-2.5e-7, cuBLASLt's
float32 1.5-2.9e-7 (``SPLITS["3xtf32"]``); hi rounded and lo truncated (the default,
"3xtf32-lotrunc") 2.4-2.6e-7; the chopped split (hi = the top 19 bits, lo = the exact
rest; two instructions a value) 5.4-5.6e-7, about twice float32's. An operand beyond
TF32's range after rounding (within 2^-12 of float32's largest) or infinite gives NaN,
where float32 FMAs give an infinity (as CUTLASS's 3xTF32). NVRTC compiles the kernel for
``sm_90a`` (CuPy's own compile path targets ``sm_90``, without ``wgmma``); the cubin is
loaded from a temporary folder.
"""

from __future__ import annotations

import functools
import hashlib
import tempfile
from pathlib import Path

import numpy as np

#: The operand splits (the kernel's CHOP): "3xtf32" rounds hi and lo to nearest TF32
#: (float32-grade), "3xtf32-chop" chops both (about twice float32's error),
#: "3xtf32-lotrunc" rounds hi and lets the tensor cores truncate lo (within 1-3% of
#: "3xtf32"'s error on the H100, call 200, since lo's sign is x's or not at random, and
#: fewer instructions). Whole-kernel static counts per split: ``benchmarks/wgmma_sass.py``.
SPLITS = {"3xtf32": 0, "3xtf32-chop": 1, "3xtf32-lotrunc": 2}
#: The split ``CudaBackend`` uses unless told otherwise: as accurate as cuBLASLt's float32
#: and the fastest float32-grade one (the medium fp32 SGD step 82.0 us against the rounded
#: split's 86.2, call 200).
DEFAULT_SPLIT = "3xtf32-lotrunc"
BK = 32  # k per tile: four wgmma k-groups of 8
#: (WGM, WGN, BN, STAGES): warpgroups along M (64 rows each) and N (BN columns each), raw
#: pipeline depth. The fastest tile at all five of the medium model's products (call 194).
TILE = (1, 1, 64, 4)
#: Blocks a product aims at (slices x tiles), about one per SM of an H100 or H200; a
#: constant, so that the slices (and the order of the sums) depend on the shapes alone.
TARGET_BLOCKS = 132
MIN_K_PER_SLICE = 256
SBO = 144  # bytes between row groups of a split tile: 128 + 16 of padding
SMEM_MAX = 227 * 1024

#: cp.async of 16 bytes (zero-filled when not valid) and its group commit and wait.
CP_ASYNC_SRC = r"""__device__ __forceinline__ void cp16(float* dst, const float* src, bool valid) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
"""

#: x = hi + lo with hi in TF32 (also ``benchmarks/wgmma_probe.py``'s).
SPLIT_SRC = r"""
// CHOP 0: hi and lo rounded to nearest TF32; CHOP 1: hi = x's top 19 bits, lo = the exact
// rest, whose low bits the tensor cores drop (two instructions; lo keeps 11 of its up to 13
// bits); CHOP 2: hi rounded to nearest, lo the exact rest, whose low bits the tensor cores
// drop (three instructions).
// hi's rounding is cvt.rna.tf32.f32's arithmetic without the guard sm_90 emulates it with
// (FSETP |x| >= inf, SEL): half a TF32 unit added to the magnitude bits, the low 13 bits
// dropped, two instructions instead of four. It is the same bits for every x but a NaN;
// for a NaN, hi may be anything, but lo = x - hi is then NaN and carries it to the
// product, so lo keeps cvt.rna's guard where it is rounded (CHOP 0). cvt.rna's own result
// has its low 13 bits clear (ptxas masks it), so lo needs no mask of ours.
__device__ __forceinline__ void split_tf32(float x, unsigned int& hi, unsigned int& lo) {
#if CHOP == 1
    hi = __float_as_uint(x) & 0xffffe000u;
#else
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
#if CHOP == 0
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
#else
    lo = __float_as_uint(x - __uint_as_float(hi));
#endif
}
"""

#: wgmma's fences, commit and wait, and the proxy fence between the split stores and it.
WGMMA_SYNC_SRC = r"""
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Generic-proxy stores to shared memory become visible to wgmma's async-proxy reads.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
"""

_SRC_HEAD = r"""
#define THREADS (128 * WGM * WGN)
#define BM (64 * WGM)
#define BNB (BN * WGN)
#define NACC (BN / 2)
// Raw float32 k-tiles as cp.async lands them: rows padded (conflict-free fragment and quad
// reads; an M-major A by 8 floats, lanes (k t, row g) then sit at banks 8 t + g).
#define A_RAW_LD (A_KMAJOR ? BK + 4 : BM + 8)
#define B_RAW_LD (B_KMAJOR ? BK + 4 : BNB + 4)
#define A_RAW ((A_KMAJOR ? BM : BK) * A_RAW_LD)
#define B_RAW ((B_KMAJOR ? BNB : BK) * B_RAW_LD)
#define B_TILE (BK / 4 * B_KG)     // B's split k-tile: TF32 hi, then lo
#define SPLIT_STAGE (2 * B_TILE)
"""

#: An operand's raw k-tiles into shared memory (``Loader``) and their split into wgmma's
#: layout (``Converter``; lo too where PRODUCTS is 3); needs BK, SBO, THREADS, cp16 and
#: split_tf32 (also ``benchmarks/wgmma_probe.py``'s).
OPERAND_SRC = r"""
// Where operand element (row e, k) sits in a split tile: core matrix (e / 8, k / 4) at
// (k / 4) KG + (e / 8) SBO, then row e % 8 at 16 bytes, k % 4 at 4.
__device__ __forceinline__ int tile_offset(int e, int k, int kg) {
    return (k / 4) * kg + (e / 8) * SBO + (e % 8) * 16 + (k % 4) * 4;
}
// An operand's raw k-tiles (EXT rows along M or N, BK along k) into shared memory by
// cp.async: G(e, k) = G[e * ld + k] (KMAJOR) or G[k * ld + e]; chunks past elimit or kend
// are zero-filled. Each chunk's source, destination and row check are worked out once.
template <int KMAJOR, int EXT, int LD>
struct Loader {
    static constexpr int L = EXT * BK / 4 / THREADS;
    static_assert(L * THREADS == EXT * BK / 4, "a tile's chunks split evenly over the threads");
    const float* src[L];
    int dst[L], kq[L];
    bool in[L];
    long long step;
    __device__ __forceinline__ Loader(const float* __restrict__ G, long long ld, int e0,
                                      int elimit, int kbeg) {
        step = KMAJOR ? BK : (long long)BK * ld;
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const int c = threadIdx.x + i * THREADS;
            const int r = KMAJOR ? c / (BK / 4) : c / (EXT / 4);
            const int q = 4 * (KMAJOR ? c % (BK / 4) : c % (EXT / 4));
            const int e = e0 + (KMAJOR ? r : q);
            kq[i] = KMAJOR ? q : r;
            in[i] = e < elimit;
            dst[i] = r * LD + q;
            src[i] = G + (KMAJOR ? (long long)e * ld + kbeg + kq[i]
                                 : (long long)(kbeg + kq[i]) * ld + e);
        }
    }
    // Tile t (its k from k0 = kbeg + t BK) into S.
    __device__ __forceinline__ void load(float* S, int t, int k0, int kend, const float* G) const {
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const bool ok = in[i] && k0 + kq[i] < kend;
            cp16(S + dst[i], ok ? src[i] + t * step : G, ok);
        }
    }
};

// A raw k-tile split into TF32 hi (and lo) in wgmma's layout. Quad c (4 floats along k if
// KMAJOR, else along e) goes to the thread that reads it so that every 8 lanes' 16-byte
// reads and the stores hit distinct banks; each quad's offsets are worked out once.
template <int KMAJOR, int EXT, int KG, int LD>
struct Converter {
    static constexpr int L = EXT * BK / 4 / THREADS;
    static_assert(L * THREADS == EXT * BK / 4, "a tile's quads split evenly over the threads");
    int rd[L], wr[L];
    __device__ __forceinline__ Converter() {
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const int c = threadIdx.x + i * THREADS;
            int e, k;
            if (KMAJOR) {  // 8 rows x 8 quads of k per 64 quads
                e = c % 8 + 8 * (c / (8 * (BK / 4)));
                k = 4 * ((c / 8) % (BK / 4));
            } else {       // 8 k x 4 quads of e per 32 quads, BK / 8 such groups along k
                k = c % 8 + 8 * ((c / 32) % (BK / 8));
                e = 4 * ((c / 8) % 4 + 4 * (c / (32 * (BK / 8))));
            }
            rd[i] = KMAJOR ? e * LD + k : k * LD + e;
            wr[i] = tile_offset(e, k, KG);  // e + j (j < 4) at + 16 j: the same row group
        }
    }
    __device__ __forceinline__ void run(const float* raw, unsigned char* hi,
                                        unsigned char* lo) const {
        float4 q[L];
#pragma unroll
        for (int i = 0; i < L; ++i)  // every read before any store: they may not alias
            q[i] = *reinterpret_cast<const float4*>(raw + rd[i]);
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const float v[4] = {q[i].x, q[i].y, q[i].z, q[i].w};
            unsigned int h[4], l[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) split_tf32(v[j], h[j], l[j]);
            if (KMAJOR) {
                *reinterpret_cast<uint4*>(hi + wr[i]) = make_uint4(h[0], h[1], h[2], h[3]);
#if PRODUCTS == 3
                *reinterpret_cast<uint4*>(lo + wr[i]) = make_uint4(l[0], l[1], l[2], l[3]);
#endif
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    *reinterpret_cast<unsigned int*>(hi + wr[i] + 16 * j) = h[j];
#if PRODUCTS == 3
                    *reinterpret_cast<unsigned int*>(lo + wr[i] + 16 * j) = l[j];
#endif
                }
            }
        }
    }
};
"""

_SRC_BODY = r"""
// Keeps the compiler from moving an accumulator's or an A fragment's register across a wait.
__device__ __forceinline__ void fence_f(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
__device__ __forceinline__ void fence_u(unsigned int& r) { asm volatile("" : "+r"(r) :: "memory"); }

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), no swizzle: start
// address, the byte offsets between core matrices along K (leading) and along N (stride),
// in 16-byte units.
__device__ __forceinline__ unsigned long long descriptor(unsigned int addr, unsigned int kgroup,
                                                         unsigned int rgroup) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(kgroup >> 4) << 16)
         | ((unsigned long long)(rgroup >> 4) << 32);
}
WGMMA_SRC
// C(M, N) (+ z M ldc for slice z) = A(M, K) B(K, N) over slice z's k, float32 in and out.
// A(m, k) at A[m * lda + k] (A_KMAJOR) or A[k * lda + m]; B(k, n) at B[n * ldb + k]
// (B_KMAJOR) or B[k * ldb + n]; C row-major, ldc. Grid (N / BNB, M / BM, slices); slice z
// takes k in [z kchunk, (z + 1) kchunk). Shared memory: two split stages of B, then STAGES
// raw ones of A and B. B's tile kt + 1 is split while the tensor cores work on tile kt.
extern "C" __global__ void __launch_bounds__(THREADS)
wgmma_3xtf32(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
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

    float acc[NACC], fresh[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = fresh[i] = 0.f;
    const Loader<A_KMAJOR, BM, A_RAW_LD> load_a(A, lda, m0, M, kbeg);
    const Loader<B_KMAJOR, BNB, B_RAW_LD> load_b(B, ldb, n0, N, kbeg);
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
    if (ntiles > 0) convert_b.run(RAW_B(0), SPLIT(0), SPLIT(0) + B_TILE);
    fence_proxy_async();
    const int ar0 = wm * 64 + 16 * warp + lane / 4;  // this thread's first A fragment row
    for (int kt = 0; kt < ntiles; ++kt) {
        cp_wait<STAGES - 3>();  // raw tile kt + 1 landed
        __syncthreads();        // ... for every thread; split tile kt written by every thread
        const int nt = kt + STAGES - 1;
        if (nt < ntiles) {      // into the raw stage of tile kt - 1, split two iterations ago
            load_a.load(RAW_A(nt), nt, kbeg + nt * BK, kend, A);
            load_b.load(RAW_B(nt), nt, kbeg + nt * BK, kend, B);
        }
        cp_commit();
        // A's fragments of tile kt, split in registers: a[v] = A(row ar0 + 8 (v % 2),
        // k 8 k8 + lane % 4 + 4 (v / 2)) (CUTLASS's SM90 ALayout_64x8 for 32-bit types),
        // untouched until the wgmma wait below.
        unsigned int ah[BK / 8][4], al[BK / 8][4];
        const float* ra = RAW_A(kt);
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int r = ar0 + 8 * (v % 2), k = 8 * k8 + lane % 4 + 4 * (v / 2);
                split_tf32(ra[A_KMAJOR ? r * A_RAW_LD + k : k * A_RAW_LD + r], ah[k8][v],
                           al[k8][v]);
            }
        const unsigned int bhi = sbase + (kt & 1) * SPLIT_STAGE + wn * (BN / 8) * SBO;
        const unsigned int blo = bhi + B_TILE;
#pragma unroll
        for (int i = 0; i < NACC; ++i) fence_f(fresh[i]);
        wgmma_fence();
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8) {  // k-groups 2 k8 and 2 k8 + 1
            const unsigned long long dbh = descriptor(bhi + 2 * k8 * B_KG, B_KG, SBO);
            const unsigned long long dbl = descriptor(blo + 2 * k8 * B_KG, B_KG, SBO);
            wgmma_tf32(fresh, al[k8], dbh, k8 == 0 ? 0 : 1);  // the small products first
            wgmma_tf32(fresh, ah[k8], dbl, 1);
            wgmma_tf32(fresh, ah[k8], dbh, 1);
        }
        wgmma_commit();
        if (kt + 1 < ntiles) {  // into the split stage tile kt - 1 used, waited for below
            unsigned char* sp = SPLIT(kt + 1);
            convert_b.run(RAW_B(kt + 1), sp, sp + B_TILE);
        }
        fence_proxy_async();
        wgmma_wait0();
#pragma unroll
        for (int i = 0; i < NACC; ++i) fence_f(fresh[i]);
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8)
#pragma unroll
            for (int v = 0; v < 4; ++v) { fence_u(ah[k8][v]); fence_u(al[k8][v]); }
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[i] += fresh[i];  // float32, round to nearest
    }
    cp_wait<0>();

    // acc[4 j + q] = C(wm 64 + 16 warp + lane / 4 + 8 (q / 2), wn BN + 8 j + 2 (lane % 4) + q % 2)
    C += (long long)blockIdx.z * M * ldc;
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
}
"""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def wgmma_source(bn: int) -> str:
    """``wgmma_tf32(d, a, desc_b, accumulate)``: D (+)= A B, m64 n``bn`` k8, TF32, A's
    fragment in registers, B from shared memory."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    a_regs = ", ".join(f"%{n + i}" for i in range(4))
    a_ins = ", ".join(f'"r"(a[{i}])' for i in range(4))
    return (
        f"__device__ __forceinline__ void wgmma_tf32(float (&d)[{n}],\n"
        f"                                           const unsigned int (&a)[4],\n"
        f"                                           unsigned long long db, int accumulate) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 5}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 "\n'
        f'                 "{{{regs}}}, {{{a_regs}}}, %{n + 4}, p, 1, 1;\\n}}\\n"\n'
        f'                 : {outs}\n'
        f'                 : {a_ins}, "l"(db), "r"(accumulate));\n'
        f"}}\n")


def kgroup_bytes(rows: int) -> int:
    """Bytes between k-groups of a ``rows``-row split tile: its row groups (SBO each),
    rounded up to 8 words past a multiple of 32, so that the four k of a core-matrix row and
    the two k-groups of a warp's stores land on distinct banks."""
    words = rows // 8 * SBO // 4
    words += (8 - words) % 32
    return 4 * words


def source(a_kmajor: int, b_kmajor: int, chop: int, tile=TILE) -> str:
    wgm, wgn, bn, stages = tile
    defines = dict(WGM=wgm, WGN=wgn, BN=bn, STAGES=stages, BK=BK, SBO=SBO,
                   B_KG=kgroup_bytes(bn * wgn), A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor,
                   CHOP=chop, PRODUCTS=3)
    return ("".join(f"#define {k} {int(v)}\n" for k, v in defines.items()) + _SRC_HEAD
            + SPLIT_SRC + CP_ASYNC_SRC + WGMMA_SYNC_SRC + OPERAND_SRC
            + _SRC_BODY.replace("WGMMA_SRC", wgmma_source(bn)))


def smem_bytes(a_kmajor: int, b_kmajor: int, tile=TILE) -> int:
    wgm, wgn, bn, stages = tile
    bm, bnb = 64 * wgm, bn * wgn
    split = 2 * BK // 4 * kgroup_bytes(bnb)
    raw_a = bm * (BK + 4) if a_kmajor else BK * (bm + 8)
    raw_b = bnb * (BK + 4) if b_kmajor else BK * (bnb + 4)
    return 2 * split + stages * 4 * (raw_a + raw_b)


def compile_cubin(src: str, arch: str = "sm_90a", verbose: bool = False) -> tuple[bytes, str]:
    """NVRTC ``src`` to a cubin for ``arch``: ``(cubin, log)``."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(src, "wgmma_3xtf32.cu", (), ())
    opts = [f"-arch={arch}", "--std=c++17"] + (["--ptxas-options=-v"] if verbose else [])
    try:
        nvrtc.compileProgram(prog, opts)
    except Exception as e:  # noqa: BLE001 - the log says why
        raise RuntimeError(f"{e}\n{nvrtc.getProgramLog(prog)}") from None
    log = nvrtc.getProgramLog(prog)
    cubin = nvrtc.getCUBIN(prog)
    nvrtc.destroyProgram(prog)
    return cubin, log


@functools.cache
def _cubin_dir():
    """Where the cubins go for CuPy to load: one folder a process, removed at its exit."""
    return tempfile.TemporaryDirectory(prefix="fuseflow_wgmma_")


def load_kernel(cubin: bytes, name: str, smem: int):
    """Kernel ``name`` of ``cubin``, allowed ``smem`` bytes of dynamic shared memory (also
    ``benchmarks/wgmma_probe.py``'s loader)."""
    import cupy

    path = Path(_cubin_dir().name) / f"{hashlib.sha256(cubin).hexdigest()}.cubin"
    path.write_bytes(cubin)
    kern = cupy.RawModule(path=str(path)).get_function(name)
    kern.max_dynamic_shared_size_bytes = smem
    return kern


@functools.cache
def _kernel(a_kmajor: int, b_kmajor: int, chop: int, tile=TILE):
    cubin, _ = compile_cubin(source(a_kmajor, b_kmajor, chop, tile))
    return load_kernel(cubin, "wgmma_3xtf32", smem_bytes(a_kmajor, b_kmajor, tile))


@functools.cache
def available() -> bool:
    """Whether the current GPU runs ``wgmma`` (compute capability 9.0: H100, H200)."""
    import cupy

    try:
        return cupy.cuda.Device().compute_capability == "90"
    except Exception:  # noqa: BLE001 - no device: not available
        return False


def slices_for(m: int, n: int, k: int, tile=TILE) -> int:
    """K slices for an (m, n, k) product: tiles x slices about ``TARGET_BLOCKS``, each
    slice at least ``MIN_K_PER_SLICE`` deep (1: not split), none of them empty."""
    tiles = _cdiv(n, tile[1] * tile[2]) * _cdiv(m, 64 * tile[0])
    want = max(1, min(round(TARGET_BLOCKS / tiles), k // MIN_K_PER_SLICE))
    return _cdiv(k, _chunk(k, want))


def _chunk(k: int, slices: int) -> int:
    """k per slice: whole k-tiles (the last slice takes the rest, or nothing)."""
    return _cdiv(_cdiv(k, slices), BK) * BK


def layout(a, b):
    """How the kernel reads the views ``a`` (M, K) and ``b`` (K, N): ``(m, n, k, a_kmajor,
    lda, b_kmajor, ldb)`` with A(m, k) at ``a[m * lda + k]`` (a_kmajor) or ``a[k * lda + m]``
    from a's first element, and B(k, n) at ``b[n * ldb + k]`` (b_kmajor) or ``b[k * ldb +
    n]``; None where either has no unit stride. Strides alone (NumPy or CuPy views)."""
    (m, k), n = a.shape, b.shape[1]
    item = a.itemsize
    if a.strides[1] == item:
        a_kmajor, lda = 1, a.strides[0] // item
    elif a.strides[0] == item:
        a_kmajor, lda = 0, a.strides[1] // item
    else:
        return None
    if b.strides[0] == item:
        b_kmajor, ldb = 1, b.strides[1] // item
    elif b.strides[1] == item:
        b_kmajor, ldb = 0, b.strides[0] // item
    else:
        return None
    return m, n, k, a_kmajor, lda, b_kmajor, ldb


def supported(m: int, n: int, k: int, a_kmajor: int, lda: int, b_kmajor: int, ldb: int,
              *arrays, tile=TILE) -> bool:
    """Whether the kernel runs this product: float32, 16-byte aligned, extents and strides
    multiples of 4 (16-byte copies), strides no shorter than their rows, int32 sizes, at
    most 65,535 row tiles (the grid's y)."""
    if not (m and n and k) or max(m, n, k) >= 2 ** 30 or _cdiv(m, 64 * tile[0]) > 65535:
        return False
    if any(e % 4 for e in (m, n, k, lda, ldb)):
        return False
    if lda < (k if a_kmajor else m) or ldb < (k if b_kmajor else n):
        return False
    return all(a.dtype == np.float32 and a.data.ptr % 16 == 0 for a in arrays)


def product(a, b, out, m: int, n: int, k: int, lda: int, ldb: int, *, a_kmajor: int,
            b_kmajor: int, slices: int, split: str = DEFAULT_SPLIT, tile=TILE):
    """``out[z] = A B`` over K slice z (``out`` (slices, m, n) C order, or (m, n) with one
    slice). A(m, k) at ``a[m * lda + k]`` (a_kmajor) or ``a[k * lda + m]``; B(k, n) at
    ``b[n * ldb + k]`` (b_kmajor) or ``b[k * ldb + n]``. On the current CuPy stream."""
    if split not in SPLITS:
        raise ValueError(f"3xTF32 matmul: split must be one of {sorted(SPLITS)}, got {split!r}")
    wgm, wgn, bn, _ = tile
    chunk = _chunk(k, slices)
    kern = _kernel(int(a_kmajor), int(b_kmajor), SPLITS[split], tile)
    kern((_cdiv(n, bn * wgn), _cdiv(m, 64 * wgm), slices), (128 * wgm * wgn,),
         (a, b, out, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(n), np.int32(chunk)),
         shared_mem=smem_bytes(int(a_kmajor), int(b_kmajor), tile))
