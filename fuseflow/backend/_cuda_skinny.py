"""Hand-written kernels for dense-layer matmuls with one side of at most 32 features.

A layer with few outputs (the 10 classes of MNIST, a 30-unit hidden layer) gives cuBLASLt
matmuls it runs badly: split-K with a separate reduction kernel, and the epilog (bias, ReLU
mask, bias gradient) as yet another kernel, 3 to 4 launches and 7 to 11 us for a few million
multiply-adds (H200, fp32; a BGRADB weight gradient of 10 x 4096 over batch 8192 took 195 us
in fp16). Here each is ONE kernel with the epilog inside, plus a second pass that adds up
per-chunk column sums where the batch is split across blocks. N, the small side, is a
compile-time constant so its accumulators live in registers. At these sizes the GPU is
latency-bound, so the kernels are laid out for many blocks, not for data reuse.

- ``forward``: ``y = act(x @ w.T + bias)`` and the relu_aux bits (cuBLASLt's layout, see
  ``epilogs.py``) or, with GELU, the gelu_aux (the pre-activation, in cuBLASLt's padded
  layout), one block per sample whose threads split the inputs, w read through the
  cache. Only for short batches (``FORWARD_MAX_MACS``): on long ones cuBLASLt's tiled
  kernels win.
- ``dgrad``: ``dx = (dy @ w) * relu'(aux)`` for N = w.shape[0] outputs, and the bias
  gradient of the lower layer (column sums of dx) in the same pass.
- ``wgrad``: ``dw = dy.T @ x`` for N = dy.shape[1] outputs; the bias gradient ``dy.sum(0)``
  rides along as one extra column of ones.
- On long batches (``VECTOR_MIN_ELEMENTS``) dgrad and wgrad give each thread V adjacent
  columns (16-byte accesses): the float16 output layer of
  784-4096-4096-10 at batch 8192 is memory-bound there.

Sums are accumulated in float32 (float64 for float64) in a fixed order: results are
deterministic. Column sums over long batches go through per-chunk partials, never atomics.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import accumulation
from fuseflow.backend import _cuda_kernels as K
from fuseflow.backend._cuda_fused import _CTYPES, HALF_HEADERS, acc_ctype

MAX_N = 32              # the largest small side handled here
#: The forward reads w from cache once per sample: past this many multiply-adds (a long
#: batch) cuBLASLt's tiled kernels are faster. (A warp per 4 samples with vector loads was
#: slower than cuBLASLt at batch 8192: 42 against 34 us in float16, 88 against 80 in float32.)
FORWARD_MAX_MACS = 2 ** 25
FORWARD_THREADS = 256   # forward: threads per block (they split the inputs)
#: dgrad/wgrad give each thread V adjacent columns (16-byte loads/stores) from this many
#: batch x feature elements on: the output layer of 784-4096-4096-10 at batch 8192 in
#: float16 is memory-bound there. Below it, one column per thread keeps more, shorter
#: blocks in flight, which the latency-bound small shapes need.
VECTOR_MIN_ELEMENTS = 2 ** 21
#: Shared memory for the weight gradient's block sums: R outputs per round, as many as fit
#: (8 row groups x R x (32 V + 1) accumulators), two barriers per round.
WGRAD_SMEM_BYTES = 24 * 1024


_HEAD = HALF_HEADERS + r"""typedef {T} T; typedef {A} A;
#define N {N}
"""

#: The forward's sums, shared with ``_cuda_head``'s fused output layer (the same code, so
#: the same bits): SPB x N partial sums per thread over inputs threadIdx.x, + FWD_THREADS,
#: ..., added across each warp by shuffles into part[warp][s][j]. The kernel declares x, w,
#: B, K, row0, lane, warp and part.
FORWARD_SUMS = r"""
    A acc[SPB][N];
    #pragma unroll
    for (int s = 0; s < SPB; ++s) {
        #pragma unroll
        for (int j = 0; j < N; ++j) acc[s][j] = (A)0;
    }
    for (long long k = threadIdx.x; k < K; k += FWD_THREADS) {
        A xv[SPB];
        #pragma unroll
        for (int s = 0; s < SPB; ++s) xv[s] = row0 + s < B ? (A)x[(row0 + s) * K + k] : (A)0;
        #pragma unroll
        for (int j = 0; j < N; ++j) {
            const A wv = (A)w[(long long)j * K + k];
            #pragma unroll
            for (int s = 0; s < SPB; ++s) acc[s][j] += xv[s] * wv;
        }
    }
    #pragma unroll
    for (int s = 0; s < SPB; ++s) {
        #pragma unroll
        for (int j = 0; j < N; ++j) {
            A v = acc[s][j];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][s][j] = v;
        }
    }
    __syncthreads();
"""

# One block of FWD_THREADS per SPB samples: the threads split the K inputs, each keeps
# SPB x N partial sums (w is read once per block, not once per sample); warps reduce them
# with shuffles, then warp s adds the warps' sums of sample s and runs the epilog.
_FORWARD = r"""
extern "C" __global__ void skinny_forward(const T* __restrict__ x, const T* __restrict__ w,
        const T* __restrict__ bias, T* __restrict__ y, AUX* __restrict__ aux,
        long long B, long long K, int rows) {
    __shared__ A part[FWD_THREADS / 32][SPB][N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long row0 = (long long)blockIdx.x * SPB;
""" + FORWARD_SUMS + r"""
    const long long row = row0 + warp;
    if (warp >= SPB || row >= B) return;  // whole warps
    const bool active = lane < N;
    A v = (A)0;
    if (active) {
        #pragma unroll
        for (int g = 0; g < FWD_THREADS / 32; ++g) v += part[g][warp][lane];
    }
    if (HAS_BIAS && active) v += (A)bias[lane];
#if GELU  // as _cuda_epilogs.bias_gelu: the rounded pre-activation to aux (rows apart,
          // zeros past N), the activation of the unrounded one to y
    if (HAS_AUX && lane < rows) aux[row * rows + lane] = (T)v;
    v = ff_gelu<A>(v);
#else
    if (HAS_AUX) {
        const unsigned int m = __ballot_sync(0xffffffffu, active && v >= (A)0);
        if (lane < rows) aux[row * rows + lane] =
            (unsigned char)(lane < 4 ? (m >> (8 * lane)) & 0xffu : 0u);
    }
    if (RELU) v = v < (A)0 ? (A)0 : v;
#endif
    if (active) y[row * N + lane] = (T)v;
}
"""

# Each thread owns V adjacent columns (V > 1: one vector load/store per row where F % V == 0
# and the pointers allow it; V = 1 on short batches, where more, smaller blocks win).
_VEC = r"""
struct __align__(V * sizeof(T)) TV { T v[V]; };
"""

# With STAGE_DY the block first copies its rows r0 .. r1 of dy (contiguous, N per row) into
# dynamic shared memory, coalesced, and every thread reads its rows' N values from there
# instead of each warp loading them from global memory row by row.
_STAGE = r"""
#if STAGE_DY
extern __shared__ __align__(16) unsigned char stage_bytes[];
#define STAGE_ROWS(r0, r1) \
    T* const dys = reinterpret_cast<T*>(stage_bytes); \
    { const long long n_ = ((r1) - (r0)) * N; const T* src_ = dy + (r0) * N; \
      for (long long e = threadIdx.y * 32 + threadIdx.x; e < n_; e += 256) dys[e] = src_[e]; \
      __syncthreads(); }
#define DY_ROW(b) (dys + ((b) - r0) * N)
#else
#define STAGE_ROWS(r0, r1)
#define DY_ROW(b) (dy + (b) * N)
#endif
"""

# Thread (column group g, row group ty) of block (32, 8) handles columns g*V .. g*V+V-1 of
# rows r0 + ty, r0 + ty + 8, ... of its chunk of 8 * RPT rows; grid (column blocks,
# chunks). The bias gradient of a chunk is reduced in shared memory, then written directly
# (one chunk) or as a partial.
_DGRAD = _VEC + _STAGE + r"""
extern "C" __global__ void skinny_dgrad(const T* __restrict__ dy, const T* __restrict__ w,
        const unsigned char* __restrict__ aux, T* __restrict__ dx, A* __restrict__ part,
        T* __restrict__ db, long long B, long long F, long long ld, int rpt) {
    __shared__ A red[BGRAD ? 8 : 1][32 * V + 1];
    const long long f0 = ((long long)blockIdx.x * 32 + threadIdx.x) * V;
    const long long r0 = (long long)blockIdx.y * 8 * rpt;
    const long long r1 = r0 + 8 * rpt < B ? r0 + 8 * rpt : B;
    const bool col = f0 < F;
    STAGE_ROWS(r0, r1)
    A wv[N][V];
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        #pragma unroll
        for (int u = 0; u < V; ++u) wv[j][u] = col ? (A)w[(long long)j * F + f0 + u] : (A)0;
    }
    A colsum[V];
    #pragma unroll
    for (int u = 0; u < V; ++u) colsum[u] = (A)0;
    if (col) {
        UNROLL_ROWS
        for (long long b = r0 + threadIdx.y; b < r1; b += 8) {
            const T* d = DY_ROW(b);
            A s[V];
            #pragma unroll
            for (int u = 0; u < V; ++u) s[u] = (A)0;
            #pragma unroll
            for (int j = 0; j < N; ++j) {
                const A dj = (A)d[j];
                #pragma unroll
                for (int u = 0; u < V; ++u) s[u] += dj * wv[j][u];
            }
            // V <= 8 and f0 % V == 0: the V mask bits share one byte
            const unsigned int bits = DRELU ? (unsigned int)aux[b * ld + (f0 >> 3)] : 0xffu;
            TV out;
            #pragma unroll
            for (int u = 0; u < V; ++u) {
                if (DRELU && !((bits >> ((f0 + u) & 7)) & 1u)) s[u] = (A)0;
                out.v[u] = (T)s[u];
                if (BGRAD) colsum[u] += (A)out.v[u];
            }
            *reinterpret_cast<TV*>(dx + b * F + f0) = out;
        }
    }
    if (BGRAD) {
        #pragma unroll
        for (int u = 0; u < V; ++u) red[threadIdx.y][u * 32 + threadIdx.x] = colsum[u];
        __syncthreads();
        // 32 * V <= 256: thread c of the block adds up column c of the block's 32 * V
        const int c = threadIdx.y * 32 + threadIdx.x;
        const long long f = (long long)blockIdx.x * 32 * V + c;
        if (c < 32 * V && f < F) {
            const int slot = (c % V) * 32 + c / V;
            A s = (A)0;
            #pragma unroll
            for (int g = 0; g < 8; ++g) s += red[g][slot];
            if (gridDim.y == 1) db[f] = (T)s;
            else part[(long long)blockIdx.y * F + f] = s;
        }
    }
}
"""

# Thread (column group g, row group ty) of block (32, 8) keeps N x V sums dy[b, j] * x[b, f]
# over rows r0 + ty, r0 + ty + 8, ... of its chunk; the 8 row groups are added in shared
# memory, R outputs j at a time. Column F (when BGRADB) has x = 1: the bias gradient. One
# chunk writes dw/db directly, several write partials for the second pass.
_WGRAD = _VEC + _STAGE + r"""
extern "C" __global__ void skinny_wgrad(const T* __restrict__ dy, const T* __restrict__ x,
        A* __restrict__ part, T* __restrict__ dw, T* __restrict__ db, long long B, long long F,
        long long rows_per_chunk) {
    __shared__ A red[8][R][32 * V + 1];
    const long long FC = F + (BGRADB ? 1 : 0);
    const long long f0 = ((long long)blockIdx.x * 32 + threadIdx.x) * V;
    const long long r0 = (long long)blockIdx.y * rows_per_chunk;
    const long long r1 = r0 + rows_per_chunk < B ? r0 + rows_per_chunk : B;
    STAGE_ROWS(r0, r1)
    A acc[N][V];
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        #pragma unroll
        for (int u = 0; u < V; ++u) acc[j][u] = (A)0;
    }
    if (f0 < FC) {
        UNROLL_ROWS
        for (long long b = r0 + threadIdx.y; b < r1; b += 8) {
            A xv[V];
            if (f0 < F) {  // F % V == 0: the V columns are all inside x
                const TV t = *reinterpret_cast<const TV*>(x + b * F + f0);
                #pragma unroll
                for (int u = 0; u < V; ++u) xv[u] = (A)t.v[u];
            } else {       // the column of ones (bias gradient), then nothing
                #pragma unroll
                for (int u = 0; u < V; ++u) xv[u] = u == 0 ? (A)1 : (A)0;
            }
            const T* d = DY_ROW(b);
            #pragma unroll
            for (int j = 0; j < N; ++j) {
                const A dj = (A)d[j];
                #pragma unroll
                for (int u = 0; u < V; ++u) acc[j][u] += dj * xv[u];
            }
        }
    }
    // The 8 row groups' sums are added in shared memory, R outputs j per round (two
    // barriers a round); a block's 256 threads share the round's R * 32 * V columns.
    const long long base = (long long)blockIdx.x * 32 * V;
    const int c = threadIdx.y * 32 + threadIdx.x;
    #pragma unroll
    for (int j0 = 0; j0 < N; j0 += R) {
        __syncthreads();
        #pragma unroll
        for (int jj = 0; jj < R; ++jj) {
            if (j0 + jj < N) {
                #pragma unroll
                for (int u = 0; u < V; ++u)
                    red[threadIdx.y][jj][u * 32 + threadIdx.x] = acc[j0 + jj < N ? j0 + jj : 0][u];
            }
        }
        __syncthreads();
        for (int e = c; e < R * 32 * V; e += 256) {
            const int jj = e / (32 * V), cc = e - jj * (32 * V), j = j0 + jj;
            const long long f = base + cc;
            if (j < N && f < FC) {
                const int slot = (cc % V) * 32 + cc / V;
                A s = (A)0;
                #pragma unroll
                for (int g = 0; g < 8; ++g) s += red[g][jj][slot];
                if (gridDim.y > 1) part[((long long)blockIdx.y * N + j) * FC + f] = s;
                else if (f < F) dw[(long long)j * F + f] = (T)s;
                else db[j] = (T)s;
            }
        }
    }
}
"""

# Second pass: element i of the (rows, FC) result is the in-order sum over chunks of
# part[c * n + i]; columns f < F go to out (rows, F), column F (if any) to extra (rows,).
_SUM_CHUNKS = r"""
extern "C" __global__ void sum_chunks(const A* __restrict__ part, T* __restrict__ out,
        T* __restrict__ extra, long long n, long long chunks, long long F, long long FC) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    A s = (A)0;
    #pragma unroll 8
    for (long long c = 0; c < chunks; ++c) s += part[c * n + i];
    const long long r = i / FC, f = i - r * FC;
    if (f < F) out[r * F + f] = (T)s;
    else extra[r] = (T)s;
}
"""


def columns_per_thread(n, dtype, batch, features, *arrays):
    """V of dgrad/wgrad: ``_width`` from ``VECTOR_MIN_ELEMENTS`` batch x features on, else 1."""
    return _width(n, dtype, features, *arrays) if batch * features >= VECTOR_MIN_ELEMENTS \
        else 1


def _width(n, dtype, features, *arrays):
    """V, the columns per thread: the widest power of two whose vector is at most 16 bytes,
    whose N x V sums fit the registers, that divides ``features`` and that every array's
    address allows; 1 for small problems."""
    dtype = np.dtype(dtype)
    v = 1
    while (2 * v * dtype.itemsize <= 16 and 2 * v * n <= 96 and features % (2 * v) == 0
           and all(a.data.ptr % (2 * v * dtype.itemsize) == 0 for a in arrays)):
        v *= 2
    return v


@functools.cache
def _kernel(name, dtype, n, **flags):
    dtype = np.dtype(dtype)
    src = {"skinny_forward": _FORWARD, "skinny_dgrad": _DGRAD, "skinny_wgrad": _WGRAD,
           "sum_chunks": _SUM_CHUNKS}[name]
    defines = {"FWD_THREADS": FORWARD_THREADS, "V": 1, "R": 1, "SPB": 1, "STAGE_DY": 0,
               **{k: int(v) for k, v in flags.items()}}
    # 4 rows' loads in flight per thread where that measured faster (H200, batch 8192 x
    # 4096, 10 classes: float16 wgrad 69 -> 58 us, float32 dgrad 87 -> 66 us; the other two
    # were slower unrolled: float16 dgrad 65 -> 84, float32 wgrad 57 -> 64)
    unrolled = {("skinny_wgrad", 2), ("skinny_dgrad", 4)}
    defines["UNROLL_ROWS"] = '_Pragma("unroll 4")' \
        if (name, dtype.itemsize) in unrolled and defines["V"] > 1 else ""
    head = _HEAD.replace("{T}", _CTYPES[dtype]).replace(
        "{A}", acc_ctype(dtype)).replace("{N}", str(n))
    if name == "skinny_forward":  # the aux it writes: relu_aux bytes or gelu_aux elements
        gelu = defines.setdefault("GELU", 0)
        head += ("typedef T AUX;\n" + K.PREAMBLE) if gelu else "typedef unsigned char AUX;\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return cupy.RawKernel(head + src, name)


def row_chunks(batch: int, rpt: int):
    """``(rpt, chunks)`` of the column kernels' (32, 8) blocks: ``rpt`` rows per thread,
    raised where needed so that the chunks of 8 * rpt rows the batch splits into (a grid
    dimension) stay at most 65535."""
    rpt = max(rpt, -(-batch // (8 * 65535)))
    return rpt, max(1, -(-batch // (8 * rpt)))


def dgrad_rows_per_thread(batch: int) -> int:
    """The input gradient's rows per thread. Measured on the H200 (graph replays,
    ``benchmarks/skinny_sweep.py``): batch 256 x 30 features, 3.51 us at 2 against 3.87 at 1
    and 3.81 at 4; batch 8192 x 4096, 64.2 / 60.3 us (float32 / float16) at 64 against
    72.3 / 70.8 at 16 and 286 / 673 with the whole batch in one chunk."""
    return min(64, max(2, batch // 128))


#: The weight gradient's block target: about 4 blocks per SM of the H200 (132 SMs), a
#: constant so that the chunking, and with it the order of the sums, depends on the shapes
#: alone and not on the GPU.
WGRAD_TARGET_BLOCKS = 4 * 132


def wgrad_rows_per_chunk(batch: int, columns: int, v: int) -> int:
    """The weight gradient's rows per chunk, for ``columns`` (features, plus one for the
    bias) at ``v`` columns per thread: about ``WGRAD_TARGET_BLOCKS`` blocks over the column
    blocks and chunks, at least 32 rows a chunk. Measured on the H200 (graph
    replays, ``benchmarks/skinny_sweep.py``), this picks the fastest of 8 to 8192 rows in
    all five benchmark shapes: 784 features x 30 outputs at batch 256, 6.9 us (10.0 with 64
    rows), 4096 x 10 at batch 8192, 46.5 us in float32 (61.9 with 128 rows), 56.2 in float16
    (68.5)."""
    chunks = max(1, -(-WGRAD_TARGET_BLOCKS // -(-columns // (32 * v))))
    per = -(-batch // chunks)
    return max(32, -(-per // 8) * 8)


def sum_chunks(part, out, extra, rows, features, fc):
    """Second pass: ``out`` (rows, features) and ``extra`` (rows,), the last of ``fc``
    columns if ``fc > features``, from the in-order sum over the chunks of ``part``."""
    n = rows * fc
    k = _kernel("sum_chunks", out.dtype, 1)
    k((-(-n // 256),), (256,), (part, out, extra if extra is not None else np.uintp(0),
                              np.int64(n), np.int64(part.shape[0]), np.int64(features),
                              np.int64(fc)))


def forward_samples_per_block(k: int) -> int:
    """Samples per forward block: 2 where every thread has inputs to sum (K >= 256), else 1.
    Measured on the H200 (graph replays, ``benchmarks/skinny_sweep.py``, batch 256):
    784 -> 30, 5.8 us at 2 against 11.9 / 7.0 / 13.1 at 1 / 4 / 8; 1024 -> 10, 4.2 us
    against 5.2 at 1; 30 -> 10, 2.2 us at 1 against 2.4 at 2."""
    return 2 if k >= FORWARD_THREADS else 1


def forward(x, w, bias, *, relu: bool, aux_rows: int | None, samples_per_block=None,
            gelu: bool = False):
    """``(y, aux)``: ``act(x @ w.T + bias)`` for C-contiguous x (B, K) and w (N, K), N <= 32;
    ``aux`` is the (aux_rows, B) column-major relu_aux when ``aux_rows`` is given. With
    ``gelu`` the activation is the tanh GELU and ``aux`` the (N, B) view of the
    (aux_rows, B) column-major gelu_aux (aux_rows >= N; its rows past N are zeros).
    ``samples_per_block`` (1 to 8) overrides ``forward_samples_per_block``, for benchmarks."""
    batch, k = x.shape
    n = w.shape[0]
    y = cupy.empty((batch, n), dtype=x.dtype)
    buf = cupy.empty((batch, aux_rows), dtype=x.dtype if gelu else cupy.uint8) \
        if aux_rows else None
    if batch:
        spb = samples_per_block or forward_samples_per_block(k)
        if not 1 <= spb <= FORWARD_THREADS // 32:  # warp s finishes sample s
            raise ValueError(f"skinny forward: samples_per_block={spb} is outside "
                             f"1..{FORWARD_THREADS // 32}")
        kern = _kernel("skinny_forward", x.dtype, n, HAS_BIAS=bias is not None,
                       HAS_AUX=aux_rows is not None, RELU=relu and not gelu, SPB=spb,
                       GELU=gelu)
        kern((-(-batch // spb),), (FORWARD_THREADS,),
             (x, w, bias if bias is not None else np.uintp(0), y,
              buf if buf is not None else np.uintp(0), np.int64(batch), np.int64(k),
              np.int32(aux_rows or 0)))
    if buf is not None and gelu:
        return y, buf.T[:n]
    return y, (buf.T if buf is not None else None)


#: Shared memory a kernel may declare without opting in (static + dynamic), bytes.
_SMEM_LIMIT = 48 * 1024
#: dy's rows go through shared memory where the block's whole shared memory stays within
#: this. Measured on the H200 (graph replays, ``benchmarks/skinny_sweep.py``,
#: ``skinny_sweep_staging.json``): staged faster at 18-28 KB a block (784-30-10's first
#: weight gradient 6.9 -> 5.6 us; at batch 8192 x 4096 x 10 the float16 weight gradient
#: 56.9 -> 51.6, the input gradients 62.3 -> 48.1 in float16 and 65.1 -> 53.6 in float32),
#: slower at 41 KB (the float32 weight gradient there, 46.7 -> 51.4: fewer blocks per SM),
#: within 0.1 us at the small ones.
STAGE_MAX_BLOCK_BYTES = 32 * 1024


def dgrad_shared_bytes(v: int, dtype, bgrad: bool) -> int:
    """The input gradient's static shared memory: its ``red`` array of bias-gradient sums."""
    return (8 if bgrad else 1) * (32 * v + 1) * accumulation(dtype).itemsize


def wgrad_shared_bytes(v: int, dtype, per_round: int) -> int:
    """The weight gradient's static shared memory: 8 row groups x R outputs of sums."""
    return 8 * per_round * (32 * v + 1) * accumulation(dtype).itemsize


def stage_bytes(rows: int, n: int, dtype, static_bytes: int, stage=None) -> int:
    """Dynamic shared memory for a block's ``rows`` rows of dy (STAGE_DY), or 0 for none:
    staged where the block's shared memory, the kernel's static ``static_bytes`` included,
    stays within ``STAGE_MAX_BLOCK_BYTES`` (or as ``stage`` says, for benchmarks)."""
    size = rows * n * np.dtype(dtype).itemsize
    if stage is None:
        stage = static_bytes + size <= STAGE_MAX_BLOCK_BYTES
    if stage and static_bytes + size > _SMEM_LIMIT:
        raise ValueError(f"skinny kernels: {rows} rows of dy ({size} bytes) do not fit in "
                         f"shared memory beside {static_bytes} bytes")
    return size if stage else 0


def dgrad(dy, w, aux, ld: int, *, bgrad: bool, rpt=None, stage=None):
    """``(dx, dbias)``: ``dy @ w`` for C-contiguous dy (B, N), w (N, F), N <= 32, masked by
    relu_aux ``aux`` (column n at byte ``n * ld``) when given, and its column sums.
    ``rpt`` (rows per thread) and ``stage`` (dy rows through shared memory) override the
    launch shape, for benchmarks."""
    batch, n = dy.shape
    features = w.shape[1]
    dx = cupy.empty((batch, features), dtype=dy.dtype)
    v = columns_per_thread(n, dy.dtype, batch, features, dx)
    rpt, chunks = row_chunks(batch, rpt or dgrad_rows_per_thread(batch))
    db = cupy.empty(features, dtype=dy.dtype) if bgrad else None
    part = cupy.empty((chunks, features), dtype=accumulation(dy.dtype)) if bgrad and chunks > 1 \
        else None
    if not batch:
        if bgrad:
            db.fill(0)
        return dx, db
    if features:
        dyn = stage_bytes(min(8 * rpt, batch), n, dy.dtype,
                          dgrad_shared_bytes(v, dy.dtype, bgrad), stage)
        kern = _kernel("skinny_dgrad", dy.dtype, n, DRELU=aux is not None, BGRAD=bgrad, V=v,
                       STAGE_DY=dyn > 0)
        kern((-(-features // (32 * v)), chunks), (32, 8),
             (dy, w, aux if aux is not None else np.uintp(0), dx,
              part if part is not None else np.uintp(0), db if bgrad else np.uintp(0),
              np.int64(batch), np.int64(features), np.int64(ld), np.int32(rpt)),
             shared_mem=dyn)
        if part is not None:
            sum_chunks(part, db, None, 1, features, features)
    return dx, db


def outputs_per_round(n, v, dtype, limit=WGRAD_SMEM_BYTES):
    """R of the weight gradient's block sums: as many as ``limit`` bytes of shared memory
    hold (``WGRAD_SMEM_BYTES``; 48 KB is the most a kernel may declare)."""
    return max(1, min(n, limit // wgrad_shared_bytes(v, dtype, 1)))


def wgrad(dy, x, *, bgrad: bool, rows=None, per_round=None, stage=None):
    """``(dw, dbias)``: ``dy.T @ x`` for C-contiguous dy (B, N), N <= 32, x (B, F), and
    ``dy.sum(0)`` when ``bgrad``. ``rows`` (rows per chunk, a multiple of 8),
    ``per_round`` and ``stage`` (dy rows through shared memory) override the launch shape,
    for benchmarks."""
    batch, n = dy.shape
    features = x.shape[1]
    fc = features + (1 if bgrad else 0)
    dw = cupy.empty((n, features), dtype=dy.dtype)
    db = cupy.empty(n, dtype=dy.dtype) if bgrad else None
    if not batch or not fc:
        dw.fill(0)
        if bgrad:
            db.fill(0)
        return dw, db
    v = columns_per_thread(n, dy.dtype, batch, features, x)
    rows = rows or wgrad_rows_per_chunk(batch, fc, v)
    chunks = -(-batch // rows)
    part = cupy.empty((chunks, n, fc), dtype=accumulation(dy.dtype)) if chunks > 1 else None
    most = outputs_per_round(n, v, dy.dtype, 48 * 1024)
    if per_round is not None and not 1 <= per_round <= most:
        raise ValueError(f"skinny wgrad: per_round={per_round} is outside 1..{most} for {n} "
                         f"outputs and V={v} (48 KB of shared memory)")
    r = per_round or outputs_per_round(n, v, dy.dtype)
    dyn = stage_bytes(min(rows, batch), n, dy.dtype, wgrad_shared_bytes(v, dy.dtype, r), stage)
    kern = _kernel("skinny_wgrad", dy.dtype, n, BGRADB=bgrad, V=v, R=r, STAGE_DY=dyn > 0)
    kern((-(-fc // (32 * v)), chunks), (32, 8),
         (dy, x, part if part is not None else np.uintp(0), dw,
          db if bgrad else np.uintp(0), np.int64(batch), np.int64(features), np.int64(rows)),
         shared_mem=dyn)
    if part is not None:
        sum_chunks(part, dw, db, n, features, fc)
    return dw, db
