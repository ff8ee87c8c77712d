"""The output layer and its softmax cross-entropy in one kernel (short batches).

A classifier's step ends with a skinny matmul (the logits), the loss, and the skinny input
gradient that applies the lower layer's ReLU mask: three launches in a chain, each a few
microseconds of mostly latency at MNIST scale (784-1024-1024-10 at batch 256 on the H200:
forward 4.2, loss 2.9, input gradient 4.6 us, plus the gaps between them). Every row's
loss gradient depends on that row's logits alone, so one block can take a few rows through
all three:

1. ``y = x @ w.T + bias`` for its rows: ``_cuda_skinny``'s forward (its threads split the
   inputs, then warps add their sums in shared memory);
2. the row's softmax cross-entropy and gradient: warp s holds row s's logits in its lanes,
   every lane runs ``_cuda_fused.softmax_xent``'s arithmetic on the whole row, lane j keeps
   ``dy[j]`` (times the loss scale, rounded once, where one is given);
3. ``dx = (dy @ w) * relu'(aux)``: ``_cuda_skinny``'s input gradient, one column per thread
   (with GELU below, ``* gelu'(gelu_aux)`` as ``_cuda_epilogs.dgelu`` applies it).

The rows' losses and the lower layer's bias gradient (column sums of dx) are sums over all
blocks: each block writes its partials; the block that arrives last adds the losses in
block order (``_cuda_tickets``), and the column partials go through ``sum_partials``, which
nothing in the backward waits for (the backend may run it on the side stream). The head's
weight gradient needs the whole batch of dy and stays the skinny weight-gradient kernel.

Logits, dy and dx are bit for bit those of the three separate kernels (same operations in
the same order); the loss and the bias gradient are added in another fixed order, so their
last bits differ from the unfused path's (both deterministic). With GELU below, the separate
input gradient is a cuBLASLt matmul (the skinny one takes no GELU), so dx agrees with it
to rounding, not bit for bit.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import accumulation
from fuseflow.backend import _cuda_kernels as K
from fuseflow.backend import _cuda_skinny as S
from fuseflow.backend import _cuda_tickets as tickets
from fuseflow.backend._cuda_fused import (_CTYPES, _LABEL_CTYPES, HALF_HEADERS,
                                          MAX_STATIC_CLASSES, MUL_RN_SRC, acc_ctype,
                                          row_softmax_src)

#: Threads of a block; they split the inputs (forward) and the columns (input gradient).
THREADS = S.FORWARD_THREADS
#: The largest class count: the row's logits live in registers, one per lane.
MAX_CLASSES = min(S.MAX_N, MAX_STATIC_CLASSES)

#: The row's softmax over its logits ``e[N]`` with its ``label``: the xent kernel's own text
#: (``row_softmax_src``), so the loss here and in ``_cuda_tc_head`` (one thread a row) is
#: that kernel's bit for bit.
ROW_SOFTMAX_SRC = row_softmax_src("A", "N", "label", 12)
#: A warp's row of the loss (shared with ``_cuda_skinny_tc``'s forward): lane j < N holds
#: the row's logit j as the float sum ``v`` (``active``); stores the rounded logit in y,
#: runs the xent kernel's arithmetic on the whole row in every lane, sets the row's loss
#: ``rl`` and leaves lane j's loss gradient, scaled and rounded, in ``gt``.
ROW_XENT_SRC = r"""            const T yt = (T)v;
            if (active) y[row * N + lane] = yt;
            const A z = (A)yt;  // what the loss kernel reads back
            A e[N];
            #pragma unroll
            for (int j = 0; j < N; ++j) e[j] = __shfl_sync(FULL, z, j);
            const int label = (int)labels[row];
""" + ROW_SOFTMAX_SRC + r"""            rl = log(s) - (zy - m);
            const A r = (A)1 / s;
            const A inv_n = (A)1 / (A)B;
            A g = (A)0;
            #pragma unroll
            for (int j = 0; j < N; ++j)
                if (j == lane) g = (e[j] * r - (j == label ? (A)1 : (A)0)) * inv_n;
            const T gt = (T)(gscale ? mul_rn(g, (A)gscale[0]) : g);
"""

#: The mean loss from the rows' losses ``rowloss[SPB]``: block partials, added in block
#: order by the block that arrives last (``_cuda_tickets``).
LOSS_TAIL_SRC = r"""    if (threadIdx.x == 0) {
        A t = (A)0;
        #pragma unroll
        for (int s = 0; s < SPB; ++s) t += rowloss[s];
        losspart[blockIdx.x] = t;
    }
    if (last_arrival(ticket, gridDim.x) && warp == 0) {
        A t = (A)0;
        for (long long b = lane; b < gridDim.x; b += 32) t += __ldcg(losspart + b);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL, t, o);
        if (lane == 0) loss[0] = t / (A)B;
    }
"""

_HEAD = MUL_RN_SRC + r"""
extern "C" __global__ void __launch_bounds__(FWD_THREADS) skinny_head(
        const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
        const L* __restrict__ labels, const float* __restrict__ gscale,
        const AUX* __restrict__ aux, long long ld,
        T* __restrict__ y, T* __restrict__ dy, T* __restrict__ dx, A* __restrict__ colpart,
        T* __restrict__ db, A* __restrict__ losspart, A* __restrict__ loss,
        unsigned int* __restrict__ ticket, long long B, long long K) {
    __shared__ A part[FWD_THREADS / 32][SPB][N];
#if DGRAD
    __shared__ A dls[SPB][N];  // the rows' loss gradients, for the input gradient
#endif
    __shared__ A rowloss[SPB];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long row0 = (long long)blockIdx.x * SPB;

    // 1. the logits' partial sums (skinny_forward's code)
""" + S.FORWARD_SUMS + r"""

    // 2. warp s: row row0 + s, its logits in lanes 0..N-1, then its loss and gradient (as
    // the xent kernel: every lane runs the row's arithmetic, lane j keeps dy[j]). The
    // arithmetic repeats the xent kernel's text: as a shared device function it changed
    // that kernel's registers and moves (not its arithmetic), which waits for a GPU run.
    if (warp < SPB) {
        const long long row = row0 + warp;
        A rl = (A)0;
        if (row < B) {  // whole warps
            const bool active = lane < N;
            A v = (A)0;
            if (active) {
                #pragma unroll
                for (int g = 0; g < FWD_THREADS / 32; ++g) v += part[g][warp][lane];
                if (HAS_BIAS) v += (A)bias[lane];
            }
""" + ROW_XENT_SRC + r"""            if (active) {
                dy[row * N + lane] = gt;
#if DGRAD
                dls[warp][lane] = (A)gt;
#endif
            }
        }
        if (lane == 0) rowloss[warp] = rl;
    }
    __syncthreads();

#if DGRAD
    // 3. the input gradient of the block's rows, one column per thread (as skinny_dgrad)
    for (long long k = threadIdx.x; k < K; k += FWD_THREADS) {
        A wv[N];
        #pragma unroll
        for (int j = 0; j < N; ++j) wv[j] = (A)w[(long long)j * K + k];
        A colsum = (A)0;
        #pragma unroll
        for (int s = 0; s < SPB; ++s) {
            const long long row = row0 + s;
            if (row >= B) break;
            A t = (A)0;
            #pragma unroll
            for (int j = 0; j < N; ++j) t += dls[s][j] * wv[j];
#if DRELU
            if (!((aux[row * ld + (k >> 3)] >> (k & 7)) & 1u)) t = (A)0;
            const T o = (T)t;
#elif DGELU  // as _cuda_epilogs.dgelu (and _cuda_kernels.gelu_grad, its fallback): the
            // product rounded to T, times gelu'(pre-activation), rounded again
            const T o = (T)((A)(T)t * ff_gelu_grad<A>((A)aux[row * ld + k]));
#else
            const T o = (T)t;
#endif
            dx[row * K + k] = o;
            if (BGRAD) colsum += (A)o;
        }
        if (BGRAD) {
            if (gridDim.x == 1) db[k] = (T)colsum;
            else colpart[(long long)blockIdx.x * K + k] = colsum;
        }
    }
#endif

    // 4. the mean loss: block partials, added in block order by the last block to arrive
""" + LOSS_TAIL_SRC + r"""}
"""


# The lower bias gradient from the blocks' column partials (chunks x F): thread (c, g) of
# a (32, GROUPS) block adds chunks g, g + GROUPS, ... of column 32 * blockIdx.x + c, then
# row 0 adds the groups in order. (``_cuda_skinny.sum_chunks`` runs one thread per column
# over every chunk: 8.1 us for 256 chunks x 30 columns on the H200, this about a fifth.)
_SUM = r"""
extern "C" __global__ void sum_partials(const A* __restrict__ part, T* __restrict__ out,
                                        long long chunks, long long F) {
    __shared__ A red[GROUPS][33];
    const long long f = (long long)blockIdx.x * 32 + threadIdx.x;
    A s = (A)0;
    if (f < F) {
        #pragma unroll 8
        for (long long c = threadIdx.y; c < chunks; c += GROUPS) s += part[c * F + f];
    }
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && f < F) {
        A t = (A)0;
        #pragma unroll
        for (int g = 0; g < GROUPS; ++g) t += red[g][threadIdx.x];
        out[f] = (T)t;
    }
}
"""
#: Chunk groups of the column-sum kernel (threadIdx.y).
SUM_GROUPS = 16


def _typedefs(dtype):
    return (f"{HALF_HEADERS}typedef {_CTYPES[dtype]} T; "
            f"typedef {acc_ctype(dtype)} A;\n")


@functools.cache
def _sum_kernel(dtype):
    return cupy.RawKernel(_typedefs(np.dtype(dtype)) + f"#define GROUPS {SUM_GROUPS}\n" + _SUM,
                          "sum_partials")


def sum_partials(colpart, db):
    """``db = colpart.sum(0)`` (in a fixed order) for the kernel's per-block partials."""
    chunks, features = colpart.shape
    _sum_kernel(db.dtype)((-(-features // 32),), (32, SUM_GROUPS),
                          (colpart, db, np.int64(chunks), np.int64(features)))


@functools.cache
def _kernel(dtype, label_dtype, n, spb, has_bias, dgrad, mask, bgrad):
    """``mask``: what the input gradient applies, None, "relu" (relu_aux bits) or "gelu"
    (gelu' of the gelu_aux, elements of the dtype)."""
    dtype = np.dtype(dtype)
    defines = {"FWD_THREADS": THREADS, "N": n, "SPB": spb, "HAS_BIAS": int(has_bias),
               "DGRAD": int(dgrad), "DRELU": int(mask == "relu"),
               "DGELU": int(mask == "gelu"), "BGRAD": int(bgrad)}
    aux = "T" if mask == "gelu" else "unsigned char"
    head = (_typedefs(dtype) + f"typedef {_LABEL_CTYPES[np.dtype(label_dtype)]} L;\n"
            + f"typedef {aux} AUX;\n"
            + "".join(f"#define {k} {v}\n" for k, v in defines.items())
            + (K.PREAMBLE if mask == "gelu" else ""))
    return cupy.RawKernel(head + tickets.TICKET_SRC + _HEAD, "skinny_head")


def supported(x, w, labels) -> bool:
    """Shapes and dtypes the fused kernel takes: at most ``MAX_CLASSES`` classes, integer
    labels, and short batches (where the separate kernels are the skinny SIMT ones)."""
    batch, k = x.shape
    n = w.shape[0]
    return (0 < n <= MAX_CLASSES and batch > 0 and np.dtype(x.dtype) in _CTYPES
            and labels.ndim == 1 and np.dtype(labels.dtype) in _LABEL_CTYPES
            and batch * k * n <= S.FORWARD_MAX_MACS and batch * k < S.VECTOR_MIN_ELEMENTS)


def forward_loss_dgrad(x, w, bias, labels, grad_scale, aux, ld, *, dgrad: bool, bgrad: bool,
                       activation: str | None):
    """``(loss, y, dy, dx, db, colpart)`` for C-contiguous x (B, K), w (N, K), labels (B,):
    ``y = x @ w.T + bias``, the mean softmax cross-entropy ``loss`` and its gradient ``dy``
    (times ``grad_scale``, a 0-d float32 device array, where given), and with ``dgrad``
    ``dx = (dy @ w) * act'(aux)`` (aux: with ``activation="relu"`` the lower layer's
    relu_aux, column n at byte ``n * ld``; with ``"gelu"`` its gelu_aux, column n at
    element ``n * ld``; or None). With ``bgrad`` the column sums of dx: ``db`` directly when one
    block ran, else per-block partials ``colpart`` for ``sum_partials`` (db is then still
    to be written)."""
    batch, k = x.shape
    n = w.shape[0]
    if dgrad and aux is not None:  # the kernel reads aux as the mask's type
        want = {"relu": np.uint8, "gelu": x.dtype}.get(activation)
        if want is None or aux.dtype != want:
            raise ValueError(f"fused head: aux of dtype {aux.dtype} with activation "
                             f"{activation!r}; expected relu_aux (uint8) with 'relu' or "
                             f"gelu_aux ({np.dtype(x.dtype)}) with 'gelu'")
    spb = S.forward_samples_per_block(k)
    blocks = -(-batch // spb)
    acc = accumulation(x.dtype)
    y = cupy.empty((batch, n), dtype=x.dtype)
    dy = cupy.empty((batch, n), dtype=x.dtype)
    dx = cupy.empty((batch, k), dtype=x.dtype) if dgrad else None
    db = cupy.empty(k, dtype=x.dtype) if dgrad and bgrad else None
    colpart = cupy.empty((blocks, k), dtype=acc) if db is not None and blocks > 1 else None
    losspart = cupy.empty(blocks, dtype=acc)
    loss = cupy.empty((), dtype=acc)
    kern = _kernel(x.dtype, labels.dtype, n, spb, bias is not None, dgrad,
                   activation if dgrad and aux is not None else None, db is not None)
    null = np.uintp(0)
    kern((blocks,), (THREADS,),
         (x, w, bias if bias is not None else null, labels,
          grad_scale if grad_scale is not None else null, aux if aux is not None else null,
          np.int64(ld), y, dy, dx if dx is not None else null,
          colpart if colpart is not None else null, db if db is not None else null,
          losspart, loss, tickets.counters(1), np.int64(batch), np.int64(k)))
    return loss, y, dy, dx, db, colpart
