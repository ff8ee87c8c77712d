"""A 16-bit output layer at long batches in one pass: logits, loss and both gradients.

At 784-4096-4096-10's batch 8192 the output layer is memory-bound on its 67 MB input
``x`` (the last hidden activation): ``_cuda_skinny_tc`` runs the forward with the loss
(``tc_forward_xent``, reads x) and then both gradients (``tc_grads``, reads x again and
writes dx), about 96 us of a 1,506 us bfloat16 Adam step on an H100 (call 206). A row's
loss gradient needs the row's logits, a sum over all features, while the weight
gradient's sums run over rows: so one pass needs blocks that own feature slices (for
the weight gradient's accumulators) to see whole rows' logits. Here a thread-block
cluster of ``CL`` blocks spans the features, ``64 * WARPS`` per block, 64 per warp, and
walks a chunk of rows in tiles of ``TR``:

1. each warp copies its 64 features of the tile's rows into shared memory (``cp.async``,
   ``STAGES`` tiles in flight with their relu_aux bytes, warp-private and swizzled so that
   both fragment reads below are free of bank conflicts);
2. its partial logits (``mma.sync.m16n8k16``: w's 16 padded classes x the tile's rows,
   over its 64 features); the block adds its warps' partials and pushes them into every
   block of the cluster (distributed shared memory), where they are added in rank order,
   so every block holds the same logits. This is done for the next tile before this
   tile's gradients, so the cluster barrier that waits for them finds them there;
3. thread r of the loss warp (warp 0 in the whole form, its own warp with ``ROLES``)
   takes row r through the xent kernel's arithmetic (``_cuda_head``'s softmax): the
   row's loss, and its loss gradient dy rounded to 16 bits;
4. ``tc_grads``' step on the tile: the weight gradient ``dy.T @ x`` into registers held
   across the chunk (x read from shared memory, not again from DRAM), and the input
   gradient ``(dy @ w) * relu'(aux)`` with its column sums.

So x is read once and dx written once: 134 MB at that shape instead of 201. The chunks'
weight-gradient and column-sum partials go through ``_cuda_skinny.sum_chunks``; the
chunks' losses are added by the last lead block (``_cuda_tickets``). Logits add in
another fixed order than ``tc_forward_xent``'s (per warp, per block, per rank), so y, dy
and what follows agree with the two-kernel path to rounding, not bit for bit; all sums
run in a fixed order (deterministic). Compute capability 9.0 (clusters).

That is the "whole" form (every warp takes features, warp 0 also the loss, a whole
cluster barrier per tile). Measured on an H100 (calls 214-217, docs/benchmarks-log.md "The
fifty-first session") it was slower than the two kernels, 117 us against 100 alone, the
compiled bfloat16 steps 1.5-2.4% slower: each 32-row tile is a chain of latencies (the
cluster barrier's release fence, warp 0's rows of the loss, the block barrier) with one
8-warp block an SM. Two forms take parts of that chain off the tile's path:
``SPLIT_BARRIER`` (the barrier's arrive and wait a step apart) and ``ROLES`` (the
default since call 218: a push warp and a loss warp beside the eight feature warps, each
tile's sums, cluster barrier and loss running beside the previous tile's gradients). In
call 218 (an H100, ``tc_head_sweep.py``) the whole form took 118.4 us, the split barrier
110.1 and warp roles 95.5, against 100.3 for the two kernels. In the compiled bfloat16
steps (call 219, an H100, three rounds) roles took 0.998x the steps without the kernel
(Adam 1,547.1 against 1,549.6 us, SGD 1,543.3 against 1,546.9), the whole form 1.035x /
1.004x, split 1.010x / 1.001x; in one process beside the matmul references (calls
219-220) the Adam step's share did not move. So the backend's ``fused_tc_head`` stays
off by default: no measurable gain for a second path.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import is_half
from fuseflow.backend import _cuda_head as H
from fuseflow.backend import _cuda_skinny as S
from fuseflow.backend import _cuda_skinny_tc as TC
from fuseflow.backend import _cuda_tickets as tickets
from fuseflow.backend._cuda_fused import _LABEL_CTYPES, MUL_RN_SRC
from fuseflow.backend._cuda_gemm import CLUSTER_SRC, MAX_CLUSTER
from fuseflow.backend._env import env_int

WARPS = 8            # warps per block, 64 features each
FEATURES_PER_BLOCK = 64 * WARPS
#: Rows per tile (a multiple of 16) and tiles of x in flight per warp; read at each call
#: (benchmarks set them), the kernel built per value.
TR = 32
STAGES = 3
#: Without ``ROLES``: the cluster barrier split in two (its arrive right after the next
#: tile's push, its wait at the next step, each tile's gradients between them; dy in two
#: buffers, the mask bytes in STAGES), or whole (the form calls 216-217 tested). Call 217's
#: Nsight Compute profile put a fifth of the kernel's samples on the whole barrier's
#: release fence and wait; split, call 218 measured 110.1 us against the whole form's
#: 118.4. ``FUSEFLOW_TC_HEAD_SPLIT_BARRIER=1`` at start, or this constant; read at each call.
SPLIT_BARRIER = env_int("FUSEFLOW_TC_HEAD_SPLIT_BARRIER", 0) == 1
#: Warp roles (takes precedence over ``SPLIT_BARRIER``): the block's ``WARPS`` warps take
#: only the features' work, a push warp adds the warps' partial logits and pushes them to
#: the cluster, and a loss warp takes the rows' loss, handing each tile's dy over through
#: named barriers; so the push, the cluster barrier and the loss of a tile run beside the
#: gradients of the tile before, which call 217's profile found waiting on them. The
#: default: call 218 measured 95.5 us, the only form faster than the two kernels (100.3).
#: ``FUSEFLOW_TC_HEAD_ROLES=0`` at start, or this constant, takes the other forms.
ROLES = env_int("FUSEFLOW_TC_HEAD_ROLES", 1) == 1
#: The kernel's forms by name, as (``ROLES``, ``SPLIT_BARRIER``): benchmarks and tests
#: choose one with ``ROLES, SPLIT_BARRIER = FORMS[name]``.
FORMS = {"whole": (False, False), "split": (False, True), "roles": (True, False)}
MAX_SHARED = 227 * 1024  # a block's dynamic shared memory on compute capability 9.0
#: Clusters of the grid (each takes a contiguous chunk of rows): at most as many as run at
#: once, or a second wave doubles the time. One block an SM (the tiles take most of the
#: shared memory); an H100 ran 14 clusters of 8 blocks at once (call 214: 15-32 clusters
#: took two or three waves' time), 112 of its 132 SMs. ``FUSEFLOW_TC_HEAD_CLUSTERS`` at
#: start, or this constant, sets another count (benchmarks sweep it). Read at each call.
CLUSTERS = max(1, env_int("FUSEFLOW_TC_HEAD_CLUSTERS", 14))

_SRC = CLUSTER_SRC + r"""
#define HSW (TR * 64)  // halves of one warp's slice of one tile
// the swizzled 16-byte chunk of a row: ldmatrix's 8 consecutive rows and the weight
// gradient's rows 4t + i (t = 0..3) x chunks g, g^1 land in distinct bank groups
__device__ __forceinline__ int swz(int r) { return (r & 7) ^ ((r >> 2) & 2); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n"
                 :: "r"(s), "l"(src), "r"(ok ? 8 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_wait_stages() {  // all but the newest STAGES - 2 groups
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2) : "memory");
}
__device__ __forceinline__ void ldsm4(unsigned* r, const T* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}
__device__ __forceinline__ void lds16(unsigned* r, const T* p) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}
// the cluster barrier in two halves (cluster_sync is both): a thread's shared-memory
// writes before its arrive are visible to the cluster's reads after the wait
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// two floats into the shared memory of cluster block rank, where p is in this block's
// (a store: nothing waits for it; the next cluster barrier makes it visible)
__device__ __forceinline__ void push2(float* p, unsigned rank, float a, float b) {
    const unsigned local = (unsigned)__cvta_generic_to_shared(p);
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};"
                 :: "r"(remote), "f"(a), "f"(b) : "memory");
}

// a named barrier of n threads (ids 1-4; 0 is __syncthreads'): bar_arrive does not wait,
// and the arriving threads' shared-memory writes are visible to the waiting threads after
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(n) : "memory");
}
// a cluster arrive that publishes nothing (threads that write nothing a peer reads)
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS, 1)
tc_head(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
        const L* __restrict__ labels, const float* __restrict__ gscale,
        const unsigned char* __restrict__ aux, long long ld, T* __restrict__ y,
        float* __restrict__ wpart, T* __restrict__ dw, T* __restrict__ db,
        T* __restrict__ dx, float* __restrict__ xpart, T* __restrict__ dxb,
        A* __restrict__ losspart, A* __restrict__ loss, unsigned int* __restrict__ ticket,
        long long B, long long F, long long RPC) {
    static_assert(TR <= 32, "one thread of a warp per row of a tile");
    extern __shared__ __align__(128) unsigned char smem[];
    T* hs = reinterpret_cast<T*>(smem);                        // [STAGES][WARPS][TR][64]
    float* red = reinterpret_cast<float*>(hs + STAGES * WARPS * HSW);
                                                        // [RED_BUFS][WARPS][16][TR]: warp sums
    float* gat = red + RED_BUFS * WARPS * 16 * TR;  // [GAT_SLOTS][CL][16][TR]: block sums
    T* dyb = reinterpret_cast<T*>(gat + GAT_SLOTS * CL * 16 * TR);  // [DY_BUFS][16][DP]: dy^T
    unsigned char* msb = reinterpret_cast<unsigned char*>(dyb + DY_BUFS * 16 * DP);
                                                   // [MASK_BUFS][TR][WARPS * 8]: mask bytes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int fwarp = ROLES && warp >= WARPS ? 0 : warp;  // ROLES' push, loss warps
    const unsigned rank = blockIdx.x;  // the cluster spans x
    const bool lead = rank == 0;
    const long long c0 = (long long)blockIdx.y * RPC;
    const long long crows = (B - c0 < RPC) ? B - c0 : RPC;
    const int tiles = crows > 0 ? (int)((crows + TR - 1) / TR) : 0;
    const long long FC = F + (BGRADB ? 1 : 0);
    const long long fb0 = (long long)blockIdx.x * WARPS * 64;
    const long long fb = fb0 + (long long)fwarp * 64;
    T* hw = hs + fwarp * HSW;

    // tile i's rows of this warp's features into stage i % STAGES (zeros past the chunk)
    auto load_tile = [&](int i) {
        if (i < tiles) {
            const long long r0 = c0 + (long long)i * TR;
            T* dst = hw + (i % STAGES) * (WARPS * HSW);
            #pragma unroll
            for (int q = 0; q < TR * 8 / 32; ++q) {
                const int e = q * 32 + lane, r = e >> 3, c = e & 7;
                const bool ok = r0 + r < c0 + crows;
                cp_async16(dst + r * 64 + ((c ^ swz(r)) << 3),
                           x + (ok ? (r0 + r) * F + fb + 8 * c : 0), ok);
            }
        }
        cp_commit();  // empty past the last tile: the group count stays uniform
    };
    // tile i's relu_aux bytes of the block's features, 8 a warp (ld % 8 == 0), copied
    // asynchronously by the feature warps: they join the next committed group of tiles.
    // Staged STAGES - 2 tiles ahead, so that the cp.async wait of tile i's step (which
    // leaves the newest STAGES - 2 groups in flight) covers tile i's bytes
    auto stage_mask = [&](int i) {
        if (!DRELU || i >= tiles) return;
        const long long r0 = c0 + (long long)i * TR;
        unsigned char* ms = msb + (i % MASK_BUFS) * (TR * WARPS * 8);
        for (int e = threadIdx.x; e < TR * WARPS; e += WARPS * 32) {
            const int r = e / WARPS, k = e - r * WARPS;
            const bool ok = r0 + r < c0 + crows;
            cp_async8(ms + r * (WARPS * 8) + 8 * k,
                      aux + (ok ? (r0 + r) * ld + fb0 / 8 + 8 * k : 0), ok);
        }
    };

    // the logits' A words: w at classes g, g + 8 and features fb + 16s + (2t, 2t+1 | +8)
    unsigned wa[4][4];
    const T* w0 = w + (long long)g * F + fb + 2 * t;
    const T* w1 = w0 + 8 * F;
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
        wa[s][0] = g < N ? *reinterpret_cast<const unsigned*>(w0 + 16 * s) : 0u;
        wa[s][1] = g + 8 < N ? *reinterpret_cast<const unsigned*>(w1 + 16 * s) : 0u;
        wa[s][2] = g < N ? *reinterpret_cast<const unsigned*>(w0 + 16 * s + 8) : 0u;
        wa[s][3] = g + 8 < N ? *reinterpret_cast<const unsigned*>(w1 + 16 * s + 8) : 0u;
    }
    // the warp sums' buffer of tile i, and the cluster sums' slot of tile i
    auto red_of = [&](int i) { return red + (RED_BUFS == 2 ? (i & 1) : 0) * WARPS * 16 * TR; };
    auto slot_of = [&](int i) { return GAT_SLOTS == 2 ? (i & 1) : i % GAT_SLOTS; };
    // tile i's partial logits of this warp's features, transposed: D(classes, rows) into
    // the warp's part of red_of(i) (tile i's x must be in shared memory)
    auto warp_logits = [&](int i) {
        const T* ht = hw + (i % STAGES) * (WARPS * HSW);
        float* rw = red_of(i) + warp * 16 * TR;
        #pragma unroll
        for (int n = 0; n < TR / 8; ++n) {
            float lg[4] = {0.f, 0.f, 0.f, 0.f};
            const int r = 8 * n + (lane & 7);
            #pragma unroll
            for (int h = 0; h < 2; ++h) {  // chunks 4h..4h+3: k16 steps 2h and 2h + 1
                const int c = 4 * h + (lane >> 3);
                unsigned m[4];
                ldsm4(m, ht + r * 64 + ((c ^ swz(r)) << 3));
                mma16816(lg, wa[2 * h], m[0], m[1]);
                mma16816(lg, wa[2 * h + 1], m[2], m[3]);
            }
            rw[g * TR + 8 * n + 2 * t] = lg[0];
            rw[g * TR + 8 * n + 2 * t + 1] = lg[1];
            rw[(g + 8) * TR + 8 * n + 2 * t] = lg[2];
            rw[(g + 8) * TR + 8 * n + 2 * t + 1] = lg[3];
        }
    };
    // threads tid of nthr, once the warps' partials of tile i are in red_of(i): the
    // block's sums (warps in order) pushed to slot [rank] of every block of the cluster
    auto push_logits = [&](int i, int tid, int nthr) {
        const float* rb = red_of(i);
        float* slot = gat + (slot_of(i) * CL + rank) * 16 * TR;
        for (int e = 2 * tid; e < 16 * TR; e += 2 * nthr) {
            float s0 = 0.f, s1 = 0.f;
            #pragma unroll
            for (int v = 0; v < WARPS; ++v) {
                s0 += rb[v * 16 * TR + e];
                s1 += rb[v * 16 * TR + e + 1];
            }
            #pragma unroll
            for (int q = 0; q < CL; ++q) push2(slot + e, q, s0, s1);
        }
    };

    for (int e = threadIdx.x; e < DY_BUFS * 16 * DP; e += THREADS) dyb[e] = __float2half(0.f);
    const bool feature_warp = !ROLES || warp < WARPS;
    if (feature_warp) {
        #pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < STAGES - 2) stage_mask(s);  // tiles 0 .. STAGES - 3 in the first groups
            load_tile(s);
        }
        cp_wait_stages();  // tile 0
        __syncwarp();
        if (tiles > 0) warp_logits(0);
    }
    // every block of the cluster has started before any pushes into its shared memory
    cluster_arrive_relaxed();
    cluster_wait();
    __syncthreads();

    // the input gradient's B words (tc_dgrad's): w at classes 2t, 2t+1 and 2t+8, 2t+9
@B_WORDS@
    float acc[8][4], colsum[16];
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    #pragma unroll
    for (int i = 0; i < 16; ++i) colsum[i] = 0.f;
    // the loss warp, lane r: the losses of the chunk's rows r, r + TR, ... and (lead
    // block, with BGRADB) their loss gradients' sums per class; added over lanes at the end
    A lane_loss = (A)0;
    float class_sum[N];
    #pragma unroll
    for (int j = 0; j < N; ++j) class_sum[j] = 0.f;
    const int mbyte = warp * 8 + t;
    const int pitch = DP;  // dy's, as the shared pieces of _cuda_skinny_tc name it
    // the loss warp: the bias and the loss scale once, each tile's labels a step ahead
    const bool loss_warp = warp == LOSS_WARP;
    A bias_v[N];
    #pragma unroll
    for (int j = 0; j < N; ++j)
        bias_v[j] = HAS_BIAS && loss_warp ? (A)__half2float(bias[j]) : (A)0;
    const A scale_v = gscale && loss_warp ? (A)gscale[0] : (A)1;
    int label_next = loss_warp && lane < TR && lane < crows ? (int)labels[c0 + lane] : 0;

    // the loss warp on tile i, its sums in slot_of(i) of this block: thread r takes row r
    // (the xent kernel's arithmetic, as _cuda_head's row of the loss), dy^T into dyT
    auto tile_loss = [&](int i, long long r0, long long nrows, T* dyT) {
        const int r = lane;
        const float* gi = gat + slot_of(i) * CL * 16 * TR;
        const int label = label_next;
        if (r < TR && (i + 1) * TR + r < crows)
            label_next = (int)labels[c0 + (i + 1) * TR + r];
        if (r < TR && r < nrows) {
            const long long row = r0 + r;
            A e[N];
            T yt[N];
            #pragma unroll
            for (int j = 0; j < N; ++j) {
                A v = (A)0;
                #pragma unroll
                for (int q = 0; q < CL; ++q) v += gi[(q * 16 + j) * TR + r];
                if (HAS_BIAS) v += bias_v[j];
                yt[j] = (T)v;
                e[j] = (A)yt[j];  // what the loss kernel reads back
            }
            if (lead) {
                #pragma unroll
                for (int j = 0; j < N; ++j) y[row * N + j] = yt[j];
            }
@ROW_SOFTMAX@
            lane_loss += log(s) - (zy - m);
            const A rs = (A)1 / s;
            const A inv_n = (A)1 / (A)B;
            #pragma unroll
            for (int j = 0; j < N; ++j) {
                const A gj = (e[j] * rs - (j == label ? (A)1 : (A)0)) * inv_n;
                const T gt = (T)(gscale ? mul_rn(gj, scale_v) : gj);
                dyT[j * DP + r] = gt;
                if (BGRADB && lead) class_sum[j] += __half2float(gt);
            }
        } else if (r < TR) {
            #pragma unroll
            for (int j = 0; j < N; ++j) dyT[j * DP + r] = __float2half(0.f);
        }
    };
    // a feature warp's gradients of tile i (tc_grads' step, x from shared memory)
    auto tile_grads = [&](long long r0, long long nrows, const T* ht,
                          const unsigned char* ms, const T* dyT) {
        #pragma unroll
        for (int kb = 0; kb < TR; kb += 16) {
            {   // the weight gradient: rows kb + 4t .. + 3 (logical columns 2t, 2t+1, +8)
                const int r = kb + 4 * t;
                unsigned v0[4], v1[4], v2[4], v3[4];
                lds16(v0, ht + r * 64 + ((g ^ swz(r)) << 3));
                lds16(v1, ht + (r + 1) * 64 + ((g ^ swz(r + 1)) << 3));
                lds16(v2, ht + (r + 2) * 64 + ((g ^ swz(r + 2)) << 3));
                lds16(v3, ht + (r + 3) * 64 + ((g ^ swz(r + 3)) << 3));
                const uint2 lo = *reinterpret_cast<const uint2*>(dyT + g * DP + r);
                const uint2 hi = *reinterpret_cast<const uint2*>(dyT + (g + 8) * DP + r);
                const unsigned a[4] = {lo.x, hi.x, lo.y, hi.y};
                #pragma unroll
                for (int j = 0; j < 8; ++j)
                    mma16816(acc[j], a, pair(v0, v1, j), pair(v2, v3, j));
            }
@DGRAD_STEP@
@DX_STORE@
        }
    };
// tile i's first row, rows, dy buffer; and a feature warp's x stage and mask bytes
#define TILE_ROWS(i)                                                                      \
    const long long r0 = c0 + (long long)(i) * TR;                                        \
    const long long nrows = (c0 + crows - r0 < TR) ? c0 + crows - r0 : TR;                \
    T* dyT = dyb + ((i) % DY_BUFS) * 16 * DP;
#define TILE_ARGS(i)                                                                      \
    TILE_ROWS(i)                                                                          \
    const T* ht = hw + ((i) % STAGES) * (WARPS * HSW);                                    \
    const unsigned char* ms = msb + ((i) % MASK_BUFS) * (TR * WARPS * 8);

#if !ROLES
    // Every warp takes features; warp 0 also the loss. Tile i: its logits' partials were
    // pushed in the step before; the next tile's are made and pushed before this tile's
    // gradients, so the cluster barrier that waits for them finds them there (with
    // SPLIT_BARRIER its arrive follows them at once).
    if (tiles > 0) push_logits(0, threadIdx.x, THREADS);
    if (SPLIT_BARRIER) cluster_arrive();
    #pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
        TILE_ARGS(i)
        // Tile i's sums are in every block. With the whole barrier every thread of the
        // cluster is also past tile i - 1; with its wait alone (SPLIT_BARRIER) a thread
        // may still be on tile i - 1's gradients, which read that tile's dy and mask
        // buffers, not these (dy: two buffers; the mask: STAGES, tile i + STAGES - 2's
        // written here).
        if (SPLIT_BARRIER) cluster_wait(); else cluster_sync();
        stage_mask(i + STAGES - 2);  // (read after the block barrier of its step)
        load_tile(i + STAGES - 1);   // into the stage this warp read in tile i - 1
        cp_wait_stages();  // tile i + 1's copies (and tile i + 1's mask bytes) are done,
        __syncwarp();      // this thread's, then the warp's
        if (warp == 0) tile_loss(i, r0, nrows, dyT);
        if (i + 1 < tiles) warp_logits(i + 1);
        __syncthreads();  // dy of tile i, and the warps' partials of tile i + 1
        if (i + 1 < tiles) {
            push_logits(i + 1, threadIdx.x, THREADS);
            // SPLIT_BARRIER: the barrier's wait is the next step's, this tile's gradients
            // run meanwhile
            if (SPLIT_BARRIER) cluster_arrive();
        }
        tile_grads(r0, nrows, ht, ms, dyT);
    }
    cluster_sync();  // no block leaves while a peer may still write into it
#else
    // Warp roles: WARPS feature warps, a push warp (WARPS) and a loss warp (WARPS + 1).
    // Cluster phase p: tile p's sums are in every block (each thread arrives for p + 1
    // after its wait for p). The push warp pushes tile p + 1 after phase p and arrives
    // (release); the loss warp arrives for p + 1 right after phase p (its reads of slot
    // p - 1 done: three slots), then takes tile p's loss and hands dy to the feature warps
    // (named barriers 3 and 4 by parity); the feature warps hand each tile's partials to
    // the push warp (1 and 2) and take its gradients once its dy is there, so the push,
    // the cluster barrier and the loss run beside the gradients of the tile before.
    const int hand = (WARPS + 1) * 32;  // threads of a hand-over barrier
    if (feature_warp) {
        cluster_arrive_relaxed();  // phase 0 (tile 0's partials: the block barrier above)
        #pragma unroll 1
        for (int i = 0; i < tiles; ++i) {
            TILE_ARGS(i)
            __syncwarp();  // the warp's reads of tile i - 1's stage are done
            stage_mask(i + STAGES - 2);  // read after its step's hand-over of dy
            load_tile(i + STAGES - 1);   // into the stage this warp read in tile i - 1
            cp_wait_stages();
            __syncwarp();
            if (i + 1 < tiles) {
                warp_logits(i + 1);
                bar_arrive(1 + ((i + 1) & 1), hand);
            }
            cluster_wait();            // phase i
            cluster_arrive_relaxed();  // phase i + 1
            bar_sync(3 + (i & 1), hand);  // dy of tile i
            tile_grads(r0, nrows, ht, ms, dyT);
        }
    } else if (warp == WARPS) {
        if (tiles > 0) push_logits(0, lane, 32);
        cluster_arrive();  // phase 0
        #pragma unroll 1
        for (int i = 0; i < tiles; ++i) {
            cluster_wait();  // phase i: every block read slot i - 2's sums (into i + 1's)
            if (i + 1 < tiles) {
                bar_sync(1 + ((i + 1) & 1), hand);
                push_logits(i + 1, lane, 32);
            }
            cluster_arrive();  // phase i + 1
        }
    } else {
        cluster_arrive();  // phase 0
        #pragma unroll 1
        for (int i = 0; i < tiles; ++i) {
            TILE_ROWS(i)
            cluster_wait();    // phase i: tile i's sums
            cluster_arrive();  // phase i + 1 (slot i - 1 read)
            tile_loss(i, r0, nrows, dyT);
            bar_arrive(3 + (i & 1), hand);
        }
    }
    cluster_wait();  // phase tiles: no block leaves while a peer may still write into it
#endif
    // the weight gradient's results (tc_wgrad's), the input gradient's column sums
    if (feature_warp) {
@WGRAD_STORE@
@COLSUMS@
    }
    if (lead && loss_warp) {  // the lanes' sums in a fixed tree, then the chunks in order
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) lane_loss += __shfl_xor_sync(FULL, lane_loss, o);
        #pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = class_sum[j];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
            if (BGRADB && lane == 0) {
                if (gridDim.y == 1) db[j] = __float2half_rn(v);
                else wpart[((long long)blockIdx.y * N + j) * FC + F] = v;
            }
        }
        if (lane == 0) losspart[blockIdx.y] = lane_loss;
    }
    if (lead && last_arrival(ticket, gridDim.y) && loss_warp) {  // the lead blocks
        A s = (A)0;
        for (long long c = lane; c < gridDim.y; c += 32) s += __ldcg(losspart + c);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
        if (lane == 0) loss[0] = s / (A)B;
    }
}
"""

def cluster_size(features: int) -> int:
    """Blocks of a cluster: the features over 64 per warp, ``WARPS`` warps a block."""
    return features // FEATURES_PER_BLOCK


def buffers(stages: int, split: bool = False, roles: bool = False) -> dict:
    """How many tiles' worth of each shared buffer the form keeps: warp sums (``RED_BUFS``),
    the cluster's block sums (``GAT_SLOTS``), dy (``DY_BUFS``), mask bytes (``MASK_BUFS``).
    ``split`` (``SPLIT_BARRIER``): two tiles' dy and ``stages`` tiles' mask bytes instead of
    one and ``stages - 1``; ``roles`` (``ROLES``): as ``split``, with two tiles' warp sums
    and three of block sums instead of one and two."""
    two = split or roles
    return {"RED_BUFS": 2 if roles else 1, "GAT_SLOTS": 3 if roles else 2,
            "DY_BUFS": 2 if two else 1, "MASK_BUFS": stages if two else stages - 1}


def shared_bytes(tr: int, stages: int, cl: int = MAX_CLUSTER, split: bool = False,
                 roles: bool = False) -> int:
    """The kernel's dynamic shared memory: tiles, warp sums, the cluster's block sums, dy
    (pitch tr + 16 halves: conflict-free fragment reads), mask bytes, as many of each as
    ``buffers`` says."""
    b = buffers(stages, split, roles)
    return (stages * WARPS * tr * 64 * 2 + b["RED_BUFS"] * WARPS * 16 * tr * 4
            + b["GAT_SLOTS"] * cl * 16 * tr * 4 + b["DY_BUFS"] * 16 * (tr + 16) * 2
            + b["MASK_BUFS"] * tr * WARPS * 8)


def threads(roles: bool) -> int:
    """A block's threads: ``WARPS`` feature warps, and with ``roles`` a push and a loss warp."""
    return 32 * (WARPS + (2 if roles else 0))


@functools.cache
def _kernel(n, cl, has_bias, bgradb, drelu, bgrad, label_dtype, dtype=np.float16, tr=32,
            stages=3, split=False, roles=False):
    src = TC._fill(_SRC.replace("@ROW_SOFTMAX@\n", H.ROW_SOFTMAX_SRC), WPART="wpart", DB="dxb",
                   XPART="xpart", DACC="d", DROW="2 * g + h")
    head = TC._COMMON.replace("{N}", str(n)) + MUL_RN_SRC + tickets.TICKET_SRC
    head += f"typedef float A;\ntypedef {_LABEL_CTYPES[np.dtype(label_dtype)]} L;\n"
    split = split and not roles
    smem = shared_bytes(tr, stages, cl, split, roles)
    if tr not in (16, 32) or stages not in (3, 4) or smem > MAX_SHARED:
        raise ValueError(f"_cuda_tc_head: rows per tile must be 16 or 32 and stages 3 or 4, "
                         f"in at most {MAX_SHARED} bytes of shared memory, got TR={tr}, "
                         f"STAGES={stages} ({smem} bytes)")
    defines = {"CL": cl, "WARPS": WARPS, "TR": tr, "STAGES": stages, "DP": tr + 16,
               "HAS_BIAS": int(has_bias), "BGRADB": int(bgradb), "DRELU": int(drelu),
               "BGRAD": int(bgrad), "SPLIT_BARRIER": int(split), "ROLES": int(roles),
               "THREADS": threads(roles), "LOSS_WARP": WARPS + 1 if roles else 0,
               **buffers(stages, split, roles)}
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return cupy.RawKernel(TC._source(head + src, dtype), "tc_head")


def supported(x, w, labels) -> bool:
    """float16 or bfloat16 x (B, F) and w (N, F), C-contiguous and 16-byte aligned, at most
    16 classes, F a multiple of ``FEATURES_PER_BLOCK`` in at most ``MAX_CLUSTER`` blocks,
    at least ``_cuda_skinny_tc.MIN_ELEMENTS`` batch x features, labels one per row of a
    dtype the kernel reads, on a GPU of compute capability 9.0 or later (clusters)."""
    batch, features = x.shape
    return (is_half(x.dtype) and w.dtype == x.dtype and 0 < w.shape[0] <= TC.MAX_N
            and w.shape[1] == features and features % FEATURES_PER_BLOCK == 0
            and 0 < cluster_size(features) <= MAX_CLUSTER
            and batch * features >= TC.MIN_ELEMENTS
            and x.flags.c_contiguous and w.flags.c_contiguous and TC._aligned(x, w)
            and TC.xent_supported(x, labels)
            and int(cupy.cuda.Device().compute_capability) >= 90)


def form() -> str:
    """The form ``ROLES`` and ``SPLIT_BARRIER`` choose (``ROLES`` takes precedence)."""
    return "roles" if ROLES else "split" if SPLIT_BARRIER else "whole"


def forward_grads(x, w, bias, labels, grad_scale, aux, ld, *, bgrad_w: bool, bgrad_x: bool,
                  n_clusters=None):
    """``(loss, y, dw, db, dx, dbx)`` for a ``supported`` output layer: ``(loss, y, dy) =
    _cuda_skinny_tc.forward_xent(x, w, bias, labels, grad_scale)`` followed by
    ``_cuda_skinny_tc.grads(dy, x, w, aux, ld, bgrad_w=..., bgrad_x=...)``, in one launch
    (plus the partials' sums). ``n_clusters``: the grid's clusters (default ``CLUSTERS``)."""
    batch, features = x.shape
    n = w.shape[0]
    cl = cluster_size(features)
    y = cupy.empty((batch, n), dtype=x.dtype)
    dx = cupy.empty((batch, features), dtype=x.dtype)
    dw = cupy.empty((n, features), dtype=x.dtype)
    db = cupy.empty(n, dtype=x.dtype) if bgrad_w else None
    dbx = cupy.empty(features, dtype=x.dtype) if bgrad_x else None
    aux, ld = TC._aux_aligned(aux, ld, batch)
    tr, stages = TR, STAGES
    roles, split = FORMS[form()]
    tiles = -(-batch // tr)
    per_chunk = -(-tiles // (n_clusters or CLUSTERS)) * tr
    chunks = -(-batch // per_chunk)
    fc = features + (1 if bgrad_w else 0)
    wpart = cupy.empty((chunks, n, fc), dtype=np.float32) if chunks > 1 else None
    xpart = cupy.empty((chunks, features), dtype=np.float32) if bgrad_x and chunks > 1 \
        else None
    losspart = cupy.empty(chunks, dtype=cupy.float32)
    loss = cupy.empty((), dtype=cupy.float32)
    kern = _kernel(n, cl, bias is not None, bgrad_w, aux is not None, bgrad_x,
                   np.dtype(labels.dtype), x.dtype, tr, stages, split, roles)
    smem = shared_bytes(tr, stages, cl, split, roles)
    if kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem
    null = np.uintp(0)
    kern((cl, chunks), (threads(roles),),
         (x, w, bias if bias is not None else null, labels,
          grad_scale if grad_scale is not None else null, aux if aux is not None else null,
          np.int64(ld), y, wpart if wpart is not None else null, dw,
          db if bgrad_w else null, dx, xpart if xpart is not None else null,
          dbx if bgrad_x else null, losspart, loss, tickets.counters(1), np.int64(batch),
          np.int64(features), np.int64(per_chunk)),
         shared_mem=smem)
    if wpart is not None:
        S.sum_chunks(wpart, dw, db, n, features, fc)
    if xpart is not None:
        S.sum_chunks(xpart, dbx, None, 1, features, features)
    return loss, y, dw, db, dx, dbx
