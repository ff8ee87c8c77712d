"""Tensor-core forms of the skinny 16-bit matmuls (``_cuda_skinny``): the output layer.

The float16 output layer of 784-4096-4096-10 at batch 8192 is memory-bound: each of its
three matmuls reads or writes the 67 MB activation once. The SIMT skinny kernels spend
80 fp32 FMAs per 16 bytes there and reach about 1.5 TB/s (in the profiled step on the
H200: wgrad 47 us, dgrad 42 us, cuBLASLt's forward 34 us); JAX's Triton fusions do each
in about 18 us (``profile_jax.json``). Here each
runs ``mma.sync.m16n8k16`` (float16 in, float32 accumulate) with the small side (at most
16) padded to 16, so the arithmetic is off the critical path and the kernels stream.

Fragment layouts are PTX's for m16n8k16 (g = lane / 4, t = lane % 4): A holds (row g or
g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9), B (rows 2t, 2t + 1 and 2t + 8, 2t + 9,
column g), D (rows g, g + 8, columns 2t, 2t + 1). Two freedoms make every global access a
16-byte vector:

- the reduction index may be permuted, as long as A and B use the same permutation: the
  four logical columns 2t, 2t + 1, 2t + 8, 2t + 9 of a k16 step are four adjacent elements
  in memory (``forward``: a thread's 16-byte load feeds two k16 steps; ``wgrad``: four
  adjacent batch rows);
- the output columns of the eight n8 tiles a warp runs may be any 64 features, as long as
  B and D agree: tile j's column n is feature ``8n + j`` (``wgrad``) or a mapping that
  gives each thread 2 x 8 adjacent features of a row to store (``dgrad``).

- ``forward``: ``y = x @ w.T + bias`` (no activation: the output layer); a block of 8
  warps takes 16 rows, its warps split the inputs and add their sums in shared memory.
- ``wgrad``: ``dw = dy.T @ x`` and the bias gradient ``dy.sum(0)``; a warp takes 64
  features of a chunk of rows; chunks go through ``_cuda_skinny.sum_chunks``.
- ``dgrad``: ``dx = (dy @ w) * relu'(aux)`` and its column sums (the lower layer's bias
  gradient); dy and the chunk's mask bytes are staged in shared memory.

Sums run in float32 in a fixed order: results are deterministic, but their last bits
differ from the SIMT kernels' (the tensor cores add in their own order). Measured on the
H200 at that shape (graph replays, docs/benchmarks-log.md "The fifth session"): forward 20.3
us, weight gradient 35.6, input gradient 37.8.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import is_half
from fuseflow.backend import _cuda_head as H
from fuseflow.backend import _cuda_skinny as S
from fuseflow.backend import _cuda_tickets as tickets
from fuseflow.backend._cuda_fused import _LABEL_CTYPES, HALF_HEADERS, MUL_RN_SRC

MAX_N = 16           # the small side, padded to one m16/k16 tile
#: From this many batch x features elements on (like ``_cuda_skinny.VECTOR_MIN_ELEMENTS``):
#: shorter problems are latency-bound and keep the SIMT kernels' many small blocks.
MIN_ELEMENTS = 2 ** 21
FORWARD_WARPS = 8    # forward: warps per block, splitting the inputs
GRAD_WARPS = 4       # wgrad/dgrad: warps per block, 64 features each
#: wgrad/dgrad: k16 steps of rows unrolled, so that many steps' loads are in flight per thread
GRAD_UNROLL = 2
#: The same for ``grads`` (both in one pass). Measured on an H100 (graph replays,
#: ``skinny_sweep.py --only tc``, call 116, 784-4096-4096-10's layer 3 at batch 8192): 78.8
#: us at 2, 71.4 at 4 (4 warps, 512 rows), against 39.2 + 42.7 for the two kernels apart.
GRADS_UNROLL = 4
#: Rows of a wgrad/dgrad block (a multiple of 16). Measured on the H200 at batch 8192 x
#: 4096 x 10 (graph replays, ``benchmarks/skinny_sweep.py --only tc``,
#: ``session8_skinny_sweep_tc.json``): wgrad 78.2 / 50.8 / 37.5 / 35.6 us and dgrad 45.6 /
#: 52.6 / 47.8 / 37.8 us at 64 / 128 / 256 / 512 rows (SIMT kernels: 50.2 and 46.2).
ROWS_PER_CHUNK = 512
#: A chunk's rows of dy (and of the mask bytes) sit in static shared memory: at most 48 KB
#: (the input gradient with the mask at 8 warps and 512 rows takes exactly 48 KB).
MAX_ROWS_PER_CHUNK = 512
MAX_CHUNKS = 65535   # chunks are the grid's y dimension

_COMMON = HALF_HEADERS + r"""typedef __half T;
#define N {N}

// d += a @ b over one m16n8k16 tile, float16 in, float32 accumulate
__device__ __forceinline__ void mma16816(float* d, const unsigned* a, unsigned b0,
                                         unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the 16-byte vector at p as four words (zero where !ok)
__device__ __forceinline__ void load16(unsigned* r, const T* p, bool ok) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ok) v = *reinterpret_cast<const uint4*>(p);
    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}

// half j of the 8-half vector p (low) beside half j of q (high), as one word
__device__ __forceinline__ unsigned pair(const unsigned* p, const unsigned* q, int j) {
    return __byte_perm(p[j >> 1], q[j >> 1], (j & 1) ? 0x7632 : 0x5410);
}
"""

# Pieces of kernel text that tc_wgrad, tc_dgrad and tc_grads share (``_fill`` puts them in
# place of @NAME@ lines and names the kernel's own buffers for @WPART@, @DB@ and @XPART@,
# and the input gradient's accumulators @DACC@ and the rows its fragment rows are, @DROW@).
_PIECES = {
    "STAGE_DYT": r"""
    #pragma unroll
    for (int i = 0; i < 16 * RPC / (32 * WARPS); ++i) {
        const int e = threadIdx.x + i * 32 * WARPS, r = e >> 4, c = e & 15;
        dyT[c * pitch + r] = (c < N && r < nrows) ? dy[(r0 + r) * N + c] : __float2half(0.f);
    }
""",
    "BIAS_SUMS": r"""
        const int c = threadIdx.x >> 3, q = threadIdx.x & 7;
        float s = 0.f;
        for (long long r = q; r < nrows; r += 8) s += __half2float(dyT[c * pitch + r]);
        #pragma unroll
        for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (q == 0 && c < N) {
            if (gridDim.y == 1) db[c] = __float2half_rn(s);
            else @WPART@[((long long)blockIdx.y * N + c) * FC + F] = s;
        }
""",
    "WGRAD_STEP": r"""
        const long long r = kb + 4 * t;
        unsigned v0[4], v1[4], v2[4], v3[4];
        load16(v0, xp + (r0 + r) * F, r < nrows);
        load16(v1, xp + (r0 + r + 1) * F, r + 1 < nrows);
        load16(v2, xp + (r0 + r + 2) * F, r + 2 < nrows);
        load16(v3, xp + (r0 + r + 3) * F, r + 3 < nrows);
        const uint2 lo = *reinterpret_cast<const uint2*>(dyT + g * pitch + r);
        const uint2 hi = *reinterpret_cast<const uint2*>(dyT + (g + 8) * pitch + r);
        const unsigned a[4] = {lo.x, hi.x, lo.y, hi.y};
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            mma16816(acc[j], a, pair(v0, v1, j), pair(v2, v3, j));
""",
    "WGRAD_STORE": r"""
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int c = g + 8 * h;
        if (c >= N) continue;
        const long long f = fb + 16 * t;
        if (gridDim.y == 1) {
            unsigned o[8];
            #pragma unroll
            for (int j = 0; j < 8; j += 2) {
                o[j / 2] = __byte_perm(__half_as_ushort(__float2half_rn(acc[j][2 * h])),
                                       __half_as_ushort(__float2half_rn(acc[j + 1][2 * h])),
                                       0x5410);
                o[4 + j / 2] = __byte_perm(
                    __half_as_ushort(__float2half_rn(acc[j][2 * h + 1])),
                    __half_as_ushort(__float2half_rn(acc[j + 1][2 * h + 1])), 0x5410);
            }
            *reinterpret_cast<uint4*>(dw + c * F + f) = make_uint4(o[0], o[1], o[2], o[3]);
            *reinterpret_cast<uint4*>(dw + c * F + f + 8) = make_uint4(o[4], o[5], o[6], o[7]);
        } else {
            float* p = @WPART@ + ((long long)blockIdx.y * N + c) * FC + f;
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                p[j] = acc[j][2 * h];
                p[8 + j] = acc[j][2 * h + 1];
            }
        }
    }
""",
    "STAGE_MASK": r"""
    if (DRELU) {  // the mask bytes of the block's features, 8 at a time (ld % 8 == 0)
        const long long nb = (F - fb0) / 8 < WARPS * 8 ? (F - fb0) / 8 : WARPS * 8;
        #pragma unroll
        for (int k = 0; k < (RPC + 31) / 32; ++k) {
            const int e = threadIdx.x + k * 32 * WARPS, r = e / WARPS, i = e - r * WARPS;
            if (r >= RPC) break;
            uint2 v = make_uint2(0u, 0u);
            if (r < nrows && 8 * i < nb)
                v = *reinterpret_cast<const uint2*>(aux + (r0 + r) * ld + fb0 / 8 + 8 * i);
            *reinterpret_cast<uint2*>(ms + r * (WARPS * 8) + 8 * i) = v;
        }
    }
""",
    "B_WORDS": r"""
    unsigned b[8][2];
    {
        const T* wp = w + fb + 32 * (g & 1) + 8 * (g >> 1);
        unsigned c0[4], c1[4], c2[4], c3[4];
        load16(c0, wp + (long long)(2 * t) * F, 2 * t < N);
        load16(c1, wp + (long long)(2 * t + 1) * F, 2 * t + 1 < N);
        load16(c2, wp + (long long)(2 * t + 8) * F, 2 * t + 8 < N);
        load16(c3, wp + (long long)(2 * t + 9) * F, 2 * t + 9 < N);
        #pragma unroll
        for (int j = 0; j < 8; ++j) { b[j][0] = pair(c0, c1, j); b[j][1] = pair(c2, c3, j); }
    }
""",
    # the input gradient's products of a k16 step of rows from the transposed dy in shared
    # memory (tc_grads; _cuda_tc_head): its rows permuted, fragment rows g and g + 8 being
    # the step's rows 2g and 2g + 1, so one 4-byte load gives a class's value at both
    "DGRAD_STEP": r"""
        // the input gradient of rows kb + 2g (fragment row g) and kb + 2g + 1 (row g + 8)
        const T* dc = dyT + kb + 2 * g;
        const unsigned q0 = *reinterpret_cast<const unsigned*>(dc + (2 * t) * pitch);
        const unsigned q1 = *reinterpret_cast<const unsigned*>(dc + (2 * t + 1) * pitch);
        const unsigned q2 = *reinterpret_cast<const unsigned*>(dc + (2 * t + 8) * pitch);
        const unsigned q3 = *reinterpret_cast<const unsigned*>(dc + (2 * t + 9) * pitch);
        const unsigned ad[4] = {__byte_perm(q0, q1, 0x5410), __byte_perm(q0, q1, 0x7632),
                                __byte_perm(q2, q3, 0x5410), __byte_perm(q2, q3, 0x7632)};
        float d[8][4];
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
            mma16816(d[j], ad, b[j][0], b[j][1]);
        }
""",
    "DX_STORE": r"""
        #pragma unroll
        for (int h = 0; h < 2; ++h) {        // fragment rows g and g + 8: rows @DROW@
            const long long r = kb + @DROW@;
            if (r >= nrows) continue;
            #pragma unroll
            for (int s = 0; s < 2; ++s) {    // features fb + 8t + j, fb + 32 + 8t + j
                const unsigned bits = DRELU ? ms[r * (WARPS * 8) + mbyte + 4 * s] : 0xffu;
                unsigned o[4];
                #pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    __half lo = __float2half_rn(@DACC@[j][2 * h + s]);
                    __half hi = __float2half_rn(@DACC@[j + 1][2 * h + s]);
                    if (DRELU && !((bits >> j) & 1u)) lo = __float2half(0.f);
                    if (DRELU && !((bits >> (j + 1)) & 1u)) hi = __float2half(0.f);
                    if (BGRAD) {
                        colsum[8 * s + j] += __half2float(lo);
                        colsum[8 * s + j + 1] += __half2float(hi);
                    }
                    o[j / 2] = __byte_perm(__half_as_ushort(lo), __half_as_ushort(hi), 0x5410);
                }
                *reinterpret_cast<uint4*>(dx + (r0 + r) * F + fb + 32 * s + 8 * t) =
                    make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
""",
    "COLSUMS": r"""
    if (BGRAD) {
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
            float v = colsum[i];
            #pragma unroll
            for (int o = 4; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            colsum[i] = v;
        }
        if (g == 0) {
            #pragma unroll
            for (int i = 0; i < 16; ++i) {
                const long long f = fb + 32 * (i >> 3) + 8 * t + (i & 7);
                if (gridDim.y == 1) @DB@[f] = __float2half_rn(colsum[i]);
                else @XPART@[(long long)blockIdx.y * F + f] = colsum[i];
            }
        }
    }
""",
}


def _fill(text, **names):
    """``text`` with every @PIECE@ line replaced by that piece, then the buffer names."""
    for name, piece in _PIECES.items():  # each piece starts and ends with a newline
        text = text.replace(f"\n@{name}@\n", piece)
    for name, value in names.items():
        text = text.replace(f"@{name}@", value)
    if "@" in text:
        raise ValueError(f"kernel text: an unfilled marker at {text[text.index('@'):][:30]!r}")
    return text


# Block: FORWARD_WARPS warps, 16 rows r0..r0+15. Warp w takes the 32-input chunks w, w + W,
# ...; thread (g, t) loads 8 adjacent inputs 8t..8t+7 of rows g and g + 8 and of w's rows
# g and 8 + g; the first four are k16 step one (logical columns 2t, 2t+1, 2t+8, 2t+9), the
# last four step two.
_FORWARD = r"""
extern "C" __global__ void tc_forward(const T* __restrict__ x, const T* __restrict__ w,
        const T* __restrict__ bias, T* __restrict__ y, long long B, long long K) {
    __shared__ float red[WARPS][16][17];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long r0 = (long long)blockIdx.x * 16;
    const bool ok0 = r0 + g < B, ok1 = r0 + g + 8 < B;
    const T* x0 = x + (r0 + g) * K;
    const T* x1 = x0 + 8 * K;
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    #pragma unroll 4
    for (long long kb = (long long)warp * 32; kb < K; kb += WARPS * 32) {
        const long long k = kb + 8 * t;
        const bool in = k < K;  // K % 8 == 0: a vector is all in or all out
        unsigned a0[4], a1[4], w0[4], w1[4];
        load16(a0, x0 + k, in && ok0);
        load16(a1, x1 + k, in && ok1);
        load16(w0, w + (long long)g * K + k, in && g < N);
        load16(w1, w + (long long)(8 + g) * K + k, in && 8 + g < N);
        #pragma unroll
        for (int s = 0; s < 2; ++s) {
            const unsigned a[4] = {a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1]};
            mma16816(acc[0], a, w0[2 * s], w0[2 * s + 1]);
            mma16816(acc[1], a, w1[2 * s], w1[2 * s + 1]);
        }
    }
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        red[warp][g][8 * j + 2 * t] = acc[j][0];
        red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
        red[warp][g + 8][8 * j + 2 * t] = acc[j][2];
        red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * 16; i += blockDim.x) {
        const int row = i >> 4, col = i & 15;
        if (col >= N || r0 + row >= B) continue;
        float s = 0.f;
        #pragma unroll
        for (int v = 0; v < WARPS; ++v) s += red[v][row][col];
        if (HAS_BIAS) s += __half2float(bias[col]);
        y[(r0 + row) * N + col] = __float2half_rn(s);
    }
}
"""


def _replaced(text, old, new):
    """``text`` with its one ``old`` replaced (a kernel variant made from another's text)."""
    if text.count(old) != 1:
        raise ValueError(f"kernel text: {old[:40]!r} is not there exactly once")
    return text.replace(old, new)


# tc_forward_xent: tc_forward whose blocks then take their 16 rows through the softmax
# cross-entropy (``linear_xent``): warp v sums rows v, v + WARPS of the block's partials
# in tc_forward's order (the same logits), then runs ``_cuda_head``'s row of the loss (the
# xent kernel's arithmetic: the same loss gradient); the rows' losses are added by the
# block that arrives last, as ``_cuda_head`` does.
_FORWARD_XENT = _replaced(_replaced(_replaced(
    _FORWARD,
    # four blocks an SM, as tc_forward's 60 registers allow (72 unbounded at 12-16 classes)
    "void tc_forward(", "void __launch_bounds__(WARPS * 32, 4) tc_forward_xent("),
    "T* __restrict__ y, long long B, long long K) {",
    "T* __restrict__ y, long long B, long long K,\n"
    "        const L* __restrict__ labels, const float* __restrict__ gscale,\n"
    "        T* __restrict__ dy, A* __restrict__ losspart, A* __restrict__ loss,\n"
    "        unsigned int* __restrict__ ticket) {"),
    _FORWARD[_FORWARD.index("    __syncthreads();\n    for (int i = threadIdx.x; i < 16 * 16;"):],
    """    __shared__ A rowloss[SPB];
    __syncthreads();
    for (int rw = warp; rw < SPB; rw += WARPS) {
        const long long row = r0 + rw;
        A rl = (A)0;
        if (row < B) {  // whole warps
            const bool active = lane < N;
            A v = (A)0;
            if (active) {
                #pragma unroll
                for (int u = 0; u < WARPS; ++u) v += red[u][rw][lane];
                if (HAS_BIAS) v += __half2float(bias[lane]);
            }
""" + H.ROW_XENT_SRC + """            if (active) dy[row * N + lane] = gt;
        }
        if (lane == 0) rowloss[rw] = rl;
    }
    __syncthreads();
""" + H.LOSS_TAIL_SRC + """}
""")

# Block: GRAD_WARPS warps, warp v takes features fb = (blockIdx.x * GRAD_WARPS + v) * 64 ..
# fb + 63 of rows r0..r1 (a chunk). Tile j's column n is feature fb + 8n + j. dy goes
# through shared memory transposed (dyT[class][row], classes >= N and rows >= B zero), so
# a thread's A words (classes g, g + 8; rows 4t..4t+3 of the k16 step, logical columns 2t,
# 2t+1, 2t+8, 2t+9) are two 8-byte loads. Column F of the result (BGRADB) is dy.sum(0).
_WGRAD = _fill(r"""
extern "C" __global__ void tc_wgrad(const T* __restrict__ dy, const T* __restrict__ x,
        float* __restrict__ part, T* __restrict__ dw, T* __restrict__ db, long long B,
        long long F) {
    static_assert(WARPS >= 4, "the bias sums below take 8 threads for each of 16 classes");
    // halves: rows 8-byte aligned, and the A-fragment loads free of bank conflicts
    const int pitch = RPC + 16;
    __shared__ __align__(16) T dyT[16 * (RPC + 16)];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long r0 = (long long)blockIdx.y * RPC;
    const long long nrows = (B - r0 < RPC) ? B - r0 : RPC;
    const long long FC = F + (BGRADB ? 1 : 0);
    // a fixed trip count, unrolled: every thread's loads are in flight at once
@STAGE_DYT@
    __syncthreads();
    if (BGRADB && blockIdx.x == 0 && threadIdx.x < 8 * 16) {
        // 8 threads per class (16 classes), rows strided by 8, then a shuffle tree
@BIAS_SUMS@
    }
    const long long fb = ((long long)blockIdx.x * WARPS + warp) * 64;
    if (fb >= F) return;  // whole warps; F % 64 == 0
    float acc[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const T* xp = x + fb + 8 * g;
    #pragma unroll UNROLL_ROWS
    for (long long kb = 0; kb < nrows; kb += 16) {
@WGRAD_STEP@
    }
    // thread (g, t): classes g and g + 8 at features fb + 16t + j (c0) and fb + 16t + 8 + j
@WGRAD_STORE@
}
""", WPART="part")

# Block: GRAD_WARPS warps, warp v takes features fb = (blockIdx.x * GRAD_WARPS + v) * 64 ..
# of rows r0..r1. Tile j's column n is feature fb + 32 (n & 1) + 8 (n >> 1) + j, so thread
# (g, t) ends up with features fb + 8t + j (D column 2t) and fb + 32 + 8t + j (column 2t+1)
# of rows g and g + 8: two 16-byte stores a row, four threads writing 128 adjacent bytes.
# B (w at classes 2t, 2t+1, 2t+8, 2t+9) stays in registers; dy (padded to 16 classes) and
# the chunk's relu_aux bytes of the block's features are staged in shared memory.
_DGRAD = _fill(r"""
extern "C" __global__ void tc_dgrad(const T* __restrict__ dy, const T* __restrict__ w,
        const unsigned char* __restrict__ aux, T* __restrict__ dx, float* __restrict__ part,
        T* __restrict__ db, long long B, long long F, long long ld) {
    __shared__ __align__(16) T dys[RPC * 16];                        // [rows][16]
    __shared__ __align__(16) unsigned char ms[DRELU ? RPC * WARPS * 8 : 16];  // [rows][bytes]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long r0 = (long long)blockIdx.y * RPC;
    const long long nrows = (B - r0 < RPC) ? B - r0 : RPC;
    const long long fb0 = (long long)blockIdx.x * WARPS * 64;
    // fixed trip counts, unrolled: every thread's loads are in flight at once
    #pragma unroll
    for (int i = 0; i < RPC * 16 / (32 * WARPS); ++i) {
        const int e = threadIdx.x + i * 32 * WARPS, r = e >> 4, c = e & 15;
        dys[e] = (c < N && r < nrows) ? dy[(r0 + r) * N + c] : __float2half(0.f);
    }
@STAGE_MASK@
    __syncthreads();
    const long long fb = fb0 + (long long)warp * 64;
    if (fb >= F) return;  // whole warps; F % 64 == 0
    // B words: classes (2t, 2t+1) and (2t+8, 2t+9) at this thread's column g of each tile
@B_WORDS@
    float colsum[16];
    #pragma unroll
    for (int i = 0; i < 16; ++i) colsum[i] = 0.f;
    const int mbyte = warp * 8 + t;  // mask byte of features fb + 8t.. (+4: fb + 32 + 8t..)
    #pragma unroll UNROLL_ROWS
    for (long long kb = 0; kb < nrows; kb += 16) {
        const T* d0 = dys + (kb + g) * 16;
        const T* d1 = d0 + 8 * 16;
        const unsigned a[4] = {*reinterpret_cast<const unsigned*>(d0 + 2 * t),
                               *reinterpret_cast<const unsigned*>(d1 + 2 * t),
                               *reinterpret_cast<const unsigned*>(d0 + 2 * t + 8),
                               *reinterpret_cast<const unsigned*>(d1 + 2 * t + 8)};
        float acc[8][4];
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            mma16816(acc[j], a, b[j][0], b[j][1]);
        }
@DX_STORE@
    }
@COLSUMS@
}
""", DB="db", XPART="part", DACC="acc", DROW="g + 8 * h")


# Both gradients of the output layer in one pass over the (rows, features) tiles that
# tc_wgrad and tc_dgrad share: a warp loads its 16 x 64 tile of x for the weight gradient
# and writes the same tile of dx, so x is read once and dx written once, by one launch
# (the separate kernels each stream one 67 MB activation at 784-4096-4096-10's batch 8192).
# The weight gradient's part is tc_wgrad's code. The input gradient's A operand (rows x
# classes) comes from the same transposed dy in shared memory: its rows are permuted (the
# fragment's rows g and g + 8 are the k16 step's rows 2g and 2g + 1), so one 4-byte load
# gives a class's value at both rows; the output rows follow the same permutation. dx, dw
# and the weight's bias gradient are tc_dgrad's and tc_wgrad's bit for bit (the same
# products and sums); dx's column sums add the same values in another order.
# Dynamic shared memory: dyT [16][RPC + 16] halves, then the mask bytes [RPC][WARPS * 8].
_GRADS = _fill(r"""
extern "C" __global__ void tc_grads(const T* __restrict__ dy, const T* __restrict__ x,
        const T* __restrict__ w, const unsigned char* __restrict__ aux,
        float* __restrict__ wpart, T* __restrict__ dw, T* __restrict__ db,
        T* __restrict__ dx, float* __restrict__ xpart, T* __restrict__ dxb, long long B,
        long long F, long long ld) {
    static_assert(WARPS >= 4, "the bias sums below take 8 threads for each of 16 classes");
    const int pitch = RPC + 16;
    extern __shared__ __align__(16) unsigned char smem[];
    T* dyT = reinterpret_cast<T*>(smem);
    unsigned char* ms = smem + 16 * (RPC + 16) * sizeof(T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long r0 = (long long)blockIdx.y * RPC;
    const long long nrows = (B - r0 < RPC) ? B - r0 : RPC;
    const long long FC = F + (BGRADB ? 1 : 0);
    const long long fb0 = (long long)blockIdx.x * WARPS * 64;
@STAGE_DYT@
@STAGE_MASK@
    __syncthreads();
    if (BGRADB && blockIdx.x == 0 && threadIdx.x < 8 * 16) {
@BIAS_SUMS@
    }
    const long long fb = fb0 + (long long)warp * 64;
    if (fb >= F) return;  // whole warps; F % 64 == 0
    // the input gradient's B words (tc_dgrad's): w at classes 2t, 2t+1 and 2t+8, 2t+9
@B_WORDS@
    float acc[8][4], colsum[16];
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    #pragma unroll
    for (int i = 0; i < 16; ++i) colsum[i] = 0.f;
    const T* xp = x + fb + 8 * g;
    const int mbyte = warp * 8 + t;
    #pragma unroll UNROLL_ROWS
    for (long long kb = 0; kb < nrows; kb += 16) {
        // the weight gradient (tc_wgrad's step)
@WGRAD_STEP@
@DGRAD_STEP@
@DX_STORE@
    }
    // the weight gradient's results (tc_wgrad's)
@WGRAD_STORE@
    // the input gradient's column sums (tc_dgrad's)
@COLSUMS@
}
""", WPART="wpart", DB="dxb", XPART="xpart", DACC="d", DROW="2 * g + h")


#: The bfloat16 form of the kernels' text: the same fragments (m16n8k16 has one layout for
#: both 16-bit formats), its MMA type and conversions in place of float16's.
_BF16_FORM = (("typedef __half T;", "typedef __nv_bfloat16 T;"),
              (".f32.f16.f16.f32", ".f32.bf16.bf16.f32"),
              ("__float2half_rn(", "__float2bfloat16_rn("),
              ("__float2half(", "__float2bfloat16("),
              ("__half2float(", "__bfloat162float("),
              ("__half_as_ushort(", "__bfloat16_as_ushort("),
              ("__half lo", "T lo"), ("__half hi", "T hi"))
_F16 = np.dtype(np.float16)


def _source(text, dtype):
    """``text`` for float16 or bfloat16 operands."""
    if np.dtype(dtype) == _F16:
        return text
    for old, new in _BF16_FORM:
        text = text.replace(old, new)
    return text


@functools.cache
def _kernel(name, n, unroll=GRAD_UNROLL, dtype=_F16, **flags):
    src = {"tc_forward": _FORWARD, "tc_wgrad": _WGRAD, "tc_dgrad": _DGRAD,
           "tc_grads": _GRADS}[name]
    src = src.replace("UNROLL_ROWS", str(int(unroll)))  # a literal: #pragma unroll takes one
    head = _COMMON.replace("{N}", str(n))
    head += "".join(f"#define {k} {int(v)}\n" for k, v in flags.items())
    return cupy.RawKernel(_source(head + src, dtype), name)


def _aligned(*arrays):
    return all(a.data.ptr % 16 == 0 for a in arrays)


def forward_supported(x, w, bias, activation) -> bool:
    """float16 or bfloat16, at most 16 outputs, no activation, inputs a multiple of 8,
    16-byte aligned x and w, and at least ``MIN_ELEMENTS`` batch x inputs."""
    return (is_half(x.dtype) and activation is None and 0 < w.shape[0] <= MAX_N
            and x.shape[1] % 8 == 0 and x.shape[0] * x.shape[1] >= MIN_ELEMENTS
            and _aligned(x, w))


def grad_supported(dy, big) -> bool:
    """wgrad (``big`` = x) and dgrad (``big`` = w): float16 or bfloat16, at most 16 gradient
    columns, a multiple of 64 features, 16-byte aligned, at least ``MIN_ELEMENTS`` batch x
    features, and at most ``MAX_CHUNKS`` chunks of rows (a grid dimension)."""
    return (is_half(dy.dtype) and 0 < dy.shape[1] <= MAX_N and big.shape[1] % 64 == 0
            and MIN_ELEMENTS <= dy.shape[0] * big.shape[1]
            and dy.shape[0] <= MAX_CHUNKS * ROWS_PER_CHUNK and _aligned(big))


def forward(x, w, bias):
    """``y = x @ w.T + bias`` for C-contiguous float16 x (B, K), w (N, K), N <= 16."""
    batch, k = x.shape
    n = w.shape[0]
    y = cupy.empty((batch, n), dtype=x.dtype)
    if batch:
        kern = _kernel("tc_forward", n, dtype=x.dtype, HAS_BIAS=bias is not None,
                       WARPS=FORWARD_WARPS)
        kern((-(-batch // 16),), (32 * FORWARD_WARPS,),
             (x, w, bias if bias is not None else np.uintp(0), y, np.int64(batch),
              np.int64(k)))
    return y, None


@functools.cache
def _xent_kernel(n, has_bias, label_dtype, dtype=_F16):
    head = _COMMON.replace("{N}", str(n)) + MUL_RN_SRC + tickets.TICKET_SRC
    head += f"typedef float A;\ntypedef {_LABEL_CTYPES[np.dtype(label_dtype)]} L;\n"
    defines = {"HAS_BIAS": int(has_bias), "WARPS": FORWARD_WARPS, "SPB": 16}
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return cupy.RawKernel(_source(head + _FORWARD_XENT, dtype), "tc_forward_xent")


def xent_supported(x, labels) -> bool:
    """``forward_xent``'s labels: one per row of ``x``, of an integer dtype the kernel
    reads (other labels take the unfused path, whose checks name what is wrong)."""
    return labels.shape == x.shape[:1] and np.dtype(labels.dtype) in _LABEL_CTYPES


def forward_xent(x, w, bias, labels, grad_scale):
    """``(loss, y, dy)`` in one launch: ``y = forward(x, w, bias)``, its mean softmax
    cross-entropy ``loss`` (float32) and gradient ``dy`` (float16, times ``grad_scale``, a
    0-d float32 device array, where given) for C-contiguous x (B, K), B > 0, and labels
    (B,). y and dy are bit for bit ``forward``'s and the xent kernel's; the loss adds the
    rows in another fixed order (blocks of 16, then the blocks in order)."""
    batch, k = x.shape
    n = w.shape[0]
    y = cupy.empty((batch, n), dtype=x.dtype)
    dy = cupy.empty((batch, n), dtype=x.dtype)
    blocks = -(-batch // 16)
    losspart = cupy.empty(blocks, dtype=cupy.float32)
    loss = cupy.empty((), dtype=cupy.float32)
    null = np.uintp(0)
    _xent_kernel(n, bias is not None, np.dtype(labels.dtype), x.dtype)(
        (blocks,), (32 * FORWARD_WARPS,),
        (x, w, bias if bias is not None else null, y, np.int64(batch), np.int64(k), labels,
         grad_scale if grad_scale is not None else null, dy, losspart, loss,
         tickets.counters(1)))
    return loss, y, dy


def _chunks(batch, rows):
    rows = rows or ROWS_PER_CHUNK
    if rows % 16 or not 16 <= rows <= MAX_ROWS_PER_CHUNK:
        raise ValueError(f"tensor-core skinny kernels: rows per chunk must be a multiple of "
                         f"16 from 16 to {MAX_ROWS_PER_CHUNK}, got {rows}")
    chunks = max(1, -(-batch // rows))
    if chunks > MAX_CHUNKS:
        raise ValueError(f"tensor-core skinny kernels: {batch} rows make {chunks} chunks of "
                         f"{rows}, more than the grid's {MAX_CHUNKS}. Fix: more rows per "
                         f"chunk, or the SIMT kernels (_cuda_skinny)")
    return rows, chunks


def _launch_shape(warps, unroll, default_unroll=None):
    """Warps per block and rows' k16 steps unrolled (defaults unless a benchmark sweeps)."""
    warps = GRAD_WARPS if warps is None else warps
    unroll = (default_unroll or GRAD_UNROLL) if unroll is None else unroll
    if type(warps) is not int or type(unroll) is not int or warps not in (4, 8) \
            or unroll not in (1, 2, 4):
        raise ValueError(f"tensor-core skinny kernels: warps must be 4 or 8 and unroll 1, 2 "
                         f"or 4, got warps={warps}, unroll={unroll}")
    return warps, unroll


def wgrad(dy, x, *, bgrad: bool, rows=None, warps=None, unroll=None):
    """``(dw, dbias)``: ``dy.T @ x`` for C-contiguous float16 dy (B, N), N <= 16, x (B, F),
    F % 64 == 0, and ``dy.sum(0)`` when ``bgrad``. ``rows``, ``warps``, ``unroll``: rows
    per chunk, warps per block, k16 steps unrolled (benchmarks)."""
    batch, n = dy.shape
    features = x.shape[1]
    fc = features + (1 if bgrad else 0)
    warps, unroll = _launch_shape(warps, unroll)
    dw = cupy.empty((n, features), dtype=dy.dtype)
    db = cupy.empty(n, dtype=dy.dtype) if bgrad else None
    if not batch:
        dw.fill(0)
        if bgrad:
            db.fill(0)
        return dw, db
    rows, chunks = _chunks(batch, rows)
    part = cupy.empty((chunks, n, fc), dtype=np.float32) if chunks > 1 else None
    kern = _kernel("tc_wgrad", n, unroll, dy.dtype, BGRADB=bgrad, WARPS=warps, RPC=rows)
    kern((-(-features // (64 * warps)), chunks), (32 * warps,),
         (dy, x, part if part is not None else np.uintp(0), dw,
          db if bgrad else np.uintp(0), np.int64(batch), np.int64(features)))
    if part is not None:
        S.sum_chunks(part, dw, db, n, features, fc)
    return dw, db


def _aux_aligned(aux, ld, batch):
    """``(aux, ld)`` as the kernels read them, 8 bytes at a time: relu_aux (column b at
    byte ``b * ld``, or None) as given where its columns are 8-byte aligned, else a copy
    whose columns are."""
    if aux is None or not (ld % 8 or aux.data.ptr % 8):
        return aux, ld
    rows = aux.shape[0]
    padded = cupy.zeros((batch, -(-rows // 8) * 8), dtype=np.uint8)
    padded[:, :rows] = cupy.lib.stride_tricks.as_strided(aux, (batch, rows), (ld, 1))
    return padded.T, padded.shape[1]


def dgrad(dy, w, aux, ld: int, *, bgrad: bool, rows=None, warps=None, unroll=None):
    """``(dx, dbias)``: ``dy @ w`` for C-contiguous float16 dy (B, N), N <= 16, w (N, F),
    F % 64 == 0, masked by relu_aux ``aux`` (column b at byte ``b * ld``) when given, and
    its column sums when ``bgrad``. ``rows``, ``warps``, ``unroll``: as ``wgrad``'s."""
    batch, n = dy.shape
    features = w.shape[1]
    warps, unroll = _launch_shape(warps, unroll)
    dx = cupy.empty((batch, features), dtype=dy.dtype)
    db = cupy.empty(features, dtype=dy.dtype) if bgrad else None
    if not batch:
        if bgrad:
            db.fill(0)
        return dx, db
    rows, chunks = _chunks(batch, rows)
    aux, ld = _aux_aligned(aux, ld, batch)
    part = cupy.empty((chunks, features), dtype=np.float32) if bgrad and chunks > 1 else None
    kern = _kernel("tc_dgrad", n, unroll, dy.dtype, DRELU=aux is not None, BGRAD=bgrad, WARPS=warps,
                   RPC=rows)
    kern((-(-features // (64 * warps)), chunks), (32 * warps,),
         (dy, w, aux if aux is not None else np.uintp(0), dx,
          part if part is not None else np.uintp(0), db if bgrad else np.uintp(0),
          np.int64(batch), np.int64(features), np.int64(ld)))
    if part is not None:
        S.sum_chunks(part, db, None, 1, features, features)
    return dx, db


def grads_shared_bytes(rows: int, warps: int) -> int:
    """``tc_grads``' dynamic shared memory: dy transposed, then the block's mask bytes."""
    return 16 * (rows + 16) * 2 + rows * warps * 8


def grads(dy, x, w, aux, ld: int, *, bgrad_w: bool, bgrad_x: bool, rows=None, warps=None,
          unroll=None):
    """``(dw, db, dx, dbx)``: ``wgrad(dy, x, bgrad=bgrad_w)`` and ``dgrad(dy, w, aux, ld,
    bgrad=bgrad_x)`` from one launch that reads each tile of x once and writes the same
    tile of dx (see ``_GRADS``); x and w have the same features. ``rows``, ``warps``,
    ``unroll``: as ``wgrad``'s (``unroll`` defaults to ``GRADS_UNROLL``)."""
    batch, n = dy.shape
    features = x.shape[1]
    if w.shape[1] != features:
        raise ValueError(f"tensor-core skinny grads: x has {features} features but w has "
                         f"{w.shape[1]}")
    warps, unroll = _launch_shape(warps, unroll, GRADS_UNROLL)
    fc = features + (1 if bgrad_w else 0)
    dw = cupy.empty((n, features), dtype=dy.dtype)
    db = cupy.empty(n, dtype=dy.dtype) if bgrad_w else None
    dx = cupy.empty((batch, features), dtype=dy.dtype)
    dbx = cupy.empty(features, dtype=dy.dtype) if bgrad_x else None
    if not batch:
        for a in (dw, db, dbx):
            if a is not None:
                a.fill(0)
        return dw, db, dx, dbx
    rows, chunks = _chunks(batch, rows)
    aux, ld = _aux_aligned(aux, ld, batch)
    wpart = cupy.empty((chunks, n, fc), dtype=np.float32) if chunks > 1 else None
    xpart = cupy.empty((chunks, features), dtype=np.float32) if bgrad_x and chunks > 1 \
        else None
    kern = _kernel("tc_grads", n, unroll, dy.dtype, BGRADB=bgrad_w, DRELU=aux is not None,
                   BGRAD=bgrad_x, WARPS=warps, RPC=rows)
    smem = grads_shared_bytes(rows, warps)
    if smem > S._SMEM_LIMIT and kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem  # opt in beyond 48 KB (8 warps, 512 rows)
    null = np.uintp(0)
    kern((-(-features // (64 * warps)), chunks), (32 * warps,),
         (dy, x, w, aux if aux is not None else null, wpart if wpart is not None else null,
          dw, db if bgrad_w else null, dx, xpart if xpart is not None else null,
          dbx if bgrad_x else null, np.int64(batch), np.int64(features), np.int64(ld)),
         shared_mem=smem)
    if wpart is not None:
        S.sum_chunks(wpart, dw, db, n, features, fc)
    if xpart is not None:
        S.sum_chunks(xpart, dbx, None, 1, features, features)
    return dw, db, dx, dbx
