"""fuseflow's own bias/ReLU/GELU epilogs, run after a plain cuBLASLt matmul, in place.

In full float32 (no TF32) cuBLASLt runs its matmuls on SIMT kernels that have no fused
epilog: it adds a separate ``epilogue::impl::globalKernel`` pass, which took 276 us for the
bias + ReLU + mask of an 8192 x 4096 layer on an H200 (and 262 us for DRELU), about a
quarter of the bandwidth the GPU has. These kernels do the same work in one vectorized pass
over the matmul's output, in place (no second activation buffer):

- ``bias_relu``: ``y = act(y + bias)`` and the relu_aux bits, one thread per aux byte
  (8 features of one sample, one 16-32 byte load and store).
- ``drelu``: ``dx = dx * relu'(aux)`` and, with BGRAD, the column sums of the result (the
  lower layer's bias gradient): per-chunk partials reduced in a fixed order by the block
  of each 256 columns that finishes last (``_cuda_tickets``; before, a second launch, which
  sat on the backward's critical path; float64 keeps it, see ``DRELU_TAIL``);
  deterministic.
- ``bias_gelu`` and ``dgelu``: the same for GELU (GELU_AUX_BIAS, DGELU_BGRAD), the
  gelu_aux being the pre-activation itself (the tanh formula of ``_cuda_kernels``, not
  cuBLASLt's approximation of it).

Every epilog (ReLU, GELU or none) in every float dtype; in 16 bits they round the plain
product before the bias or derivative, where cuBLASLt's fused epilogs round once.

All also take the (S, B, F) partial products of a matmul whose K the backend split into S
slices (``_k_split``): they add them in split order as they read them and write the
result to a separate output, in place of cuBLASLt's split-K reduction kernel.

The formats are cuBLASLt's (see ``epilogs.py``), the arithmetic ``_cuda_kernels``'s (the
accumulation type is float32 for float16/float32, float64 for float64). They need the
feature count to be a multiple of 8 and 8-element-aligned arrays; callers fall back to the
elementwise kernels of ``_cuda_kernels`` otherwise (``vectorizable``).
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import accumulation, bfloat16, is_half
from fuseflow.backend import _cuda_kernels as K
from fuseflow.backend import _cuda_skinny as S
from fuseflow.backend import _cuda_tickets as tickets

_HEAD = S.HALF_HEADERS + r"""typedef {T} T; typedef {A} A;
struct __align__(8 * sizeof(T)) T8 { T v[8]; };
"""

_LOAD_SUM = r"""
// 8 elements at offset i: of src itself, or (SPLITS > 0) the sum of the SPLITS partial
// products at src + s * pstride, added in split order (T is the accumulation type then)
__device__ __forceinline__ T8 load_sum(const T* __restrict__ src, long long pstride,
                                       long long i) {
    T8 t = *reinterpret_cast<const T8*>(src + i);
    #pragma unroll
    for (int s = 1; s < SPLITS; ++s) {
        const T8 p = *reinterpret_cast<const T8*>(src + s * pstride + i);
        #pragma unroll
        for (int u = 0; u < 8; ++u) t.v[u] += p.v[u];
    }
    return t;
}
"""

# Thread i is byte j of sample n's relu_aux column (rows bytes per sample, the first
# ceil(F / 8) of them data, the rest zero padding).
_BIAS_RELU = r"""
extern "C" __global__ void bias_relu(T* __restrict__ y, const T* __restrict__ bias,
        unsigned char* __restrict__ aux, long long B, long long F, long long rows,
        const T* __restrict__ part, long long pstride) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per = HAS_AUX ? rows : F / 8;
    if (i >= B * per) return;
    const long long n = i / per, j = i - n * per;
    unsigned int byte = 0u;
    if (8 * j < F) {
        T8 t = load_sum(SPLITS ? part : y, pstride, n * F + 8 * j);
        T8 b;
        if (HAS_BIAS) b = *reinterpret_cast<const T8*>(bias + 8 * j);
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            A v = (A)t.v[u];
            if (HAS_BIAS) v += (A)b.v[u];
            if (v >= (A)0) byte |= 1u << u;
            t.v[u] = (T)(RELU && v < (A)0 ? (A)0 : v);
        }
        *reinterpret_cast<T8*>(y + n * F + 8 * j) = t;
    }
    if (HAS_AUX) aux[i] = (unsigned char)byte;
}
"""

# Thread i is features 8j..8j+7 of sample n. The pre-activation comes from src (or the sum
# of its SPLITS partials); y = gelu(src + bias) and, with HAS_AUX, the pre-activation
# itself goes to aux, row n at n * F (the (F, batch) column-major gelu_aux). src may be
# aux or y (in place): each thread reads its 8 elements before it writes them.
_BIAS_GELU = r"""
extern "C" __global__ void bias_gelu(const T* src, long long pstride,
        const T* __restrict__ bias, T* y, T* aux, long long B, long long F) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * (F / 8)) return;
    const long long at = 8 * i;   // = n * F + 8 * j
    T8 t = load_sum(src, pstride, at);
    T8 b;
    if (HAS_BIAS) b = *reinterpret_cast<const T8*>(bias + at % F);
    T8 z;
    #pragma unroll
    for (int u = 0; u < 8; ++u) {
        A v = (A)t.v[u];
        if (HAS_BIAS) v += (A)b.v[u];
        z.v[u] = (T)v;
        t.v[u] = (T)ff_gelu<A>(v);
    }
    if (HAS_AUX) *reinterpret_cast<T8*>(aux + at) = z;
    *reinterpret_cast<T8*>(y + at) = t;
}
"""

# Block (32, 8), grid (ceil(F / 256), chunks): thread (tx, ty) takes the 8 features of aux
# byte j = blockIdx.x * 32 + tx over rows r0 + ty, r0 + ty + 8, ... of its chunk of
# 8 * rpt rows, UNROLL rows at a time; the 8 row groups' column sums are added in shared
# memory (each thread's sums run in row order whatever UNROLL is: the same results). With
# TICKET, the last block of a column range to finish adds the chunks' partials in chunk
# order (the order of ``sum_chunks``, so the same bits as the second launch it replaces).
# With GELU, aux is the gelu_aux (column n at element n * ld): dx *= gelu'(aux) instead of
# the mask.
_DRELU = r"""
extern "C" __global__ void drelu(T* __restrict__ dx, const void* __restrict__ auxp,
        A* __restrict__ colpart, T* __restrict__ db, long long B, long long F, long long ld,
        int rpt, const T* __restrict__ part, long long pstride,
        unsigned int* __restrict__ ticket) {
    __shared__ A red[BGRAD ? 8 : 1][257];
    const long long j = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * 8 * rpt;
    const long long r1 = r0 + 8 * rpt < B ? r0 + 8 * rpt : B;
    A cs[8];
    #pragma unroll
    for (int u = 0; u < 8; ++u) cs[u] = (A)0;
    if (8 * j < F) {
        // UNROLL rows' loads first, then their stores: that many loads in flight per thread
        for (long long b0 = r0 + threadIdx.y; b0 < r1; b0 += 8 * UNROLL) {
            T8 t[UNROLL];
            unsigned int bits[UNROLL];
            T8 pre[GELU ? UNROLL : 1];
            #pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const long long b = b0 + 8 * k;
                if (b < r1) {
                    t[k] = load_sum(SPLITS ? part : dx, pstride, b * F + 8 * j);
                    if (GELU) pre[GELU ? k : 0] = *reinterpret_cast<const T8*>(
                        static_cast<const T*>(auxp) + b * ld + 8 * j);
                    else bits[k] = static_cast<const unsigned char*>(auxp)[b * ld + j];
                }
            }
            #pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const long long b = b0 + 8 * k;
                if (b >= r1) break;
                #pragma unroll
                for (int u = 0; u < 8; ++u) {
                    if (GELU) t[k].v[u] = (T)((A)t[k].v[u] *
                                              ff_gelu_grad<A>((A)pre[GELU ? k : 0].v[u]));
                    else if (!((bits[k] >> u) & 1u)) t[k].v[u] = (T)(A)0;
                    if (BGRAD) cs[u] += (A)t[k].v[u];
                }
                *reinterpret_cast<T8*>(dx + b * F + 8 * j) = t[k];
            }
        }
    }
    if (BGRAD) {
        #pragma unroll
        for (int u = 0; u < 8; ++u) red[threadIdx.y][u * 32 + threadIdx.x] = cs[u];
        __syncthreads();
        const int c = threadIdx.y * 32 + threadIdx.x;   // feature blockIdx.x * 256 + c
        const long long f = (long long)blockIdx.x * 256 + c;
        if (f < F) {
            const int slot = (c % 8) * 32 + c / 8;
            A s = (A)0;
            #pragma unroll
            for (int g = 0; g < 8; ++g) s += red[g][slot];
            if (gridDim.y == 1) db[f] = (T)s;
            else colpart[(long long)blockIdx.y * F + f] = s;
        }
#if TICKET
        if (gridDim.y > 1 && last_arrival(ticket + blockIdx.x, gridDim.y) && f < F) {
            // TAIL chunks' loads in flight at once (one L2 round trip for a batch of 256),
            // then added in chunk order
            const long long G = gridDim.y;
            A t = (A)0;
            for (long long g0 = 0; g0 < G; g0 += TAIL) {
                A v[TAIL];
                #pragma unroll
                for (int u = 0; u < TAIL; ++u)
                    v[u] = g0 + u < G ? __ldcg(colpart + (g0 + u) * F + f) : (A)0;
                #pragma unroll
                for (int u = 0; u < TAIL; ++u)
                    if (g0 + u < G) t += v[u];
            }
            db[f] = (T)t;
        }
#endif
    }
}
"""


@functools.cache
def _kernel(name, dtype, **flags):
    dtype = np.dtype(dtype)
    head = _HEAD.replace("{T}", S._CTYPES[dtype]).replace(
        "{A}", S.acc_ctype(dtype))
    flags = {"TAIL": DRELU_TAIL.get(dtype, 1), "GELU": False, **flags}
    head += "".join(f"#define {k} {int(v)}\n" for k, v in flags.items())
    return cupy.RawKernel(head + K.PREAMBLE + tickets.TICKET_SRC + _LOAD_SUM +
                          {"bias_relu": _BIAS_RELU, "bias_gelu": _BIAS_GELU,
                           "drelu": _DRELU}[name], name)


def vectorizable(features, *arrays):
    """The features come in whole aux bytes and every array allows 8-element accesses."""
    return features % 8 == 0 and all(
        a is None or a.data.ptr % (8 * a.itemsize) == 0 for a in arrays)


def gelu_aux_vectorizable(aux, ld: int) -> bool:
    """The gelu_aux's columns (leading dimension ``ld``) allow 8-element accesses."""
    return ld % 8 == 0 and vectorizable(8, aux)


def _split_source(out, partials):
    """``(pointer, splits, stride)`` of the kernel's input: ``out`` itself (in place), or the
    (S, B, F) C-contiguous partial products of a K-split matmul, of ``out``'s dtype, which
    must then be float32 or float64 (the dtype the partials are added in)."""
    if partials is None:
        return np.uintp(0), 0, 0
    if partials.dtype != out.dtype or is_half(out.dtype) or partials.ndim != 3 or \
            partials.shape[0] < 1 or partials.shape[1:] != out.shape or \
            not partials.flags.c_contiguous:
        raise ValueError(f"partials {partials.shape} {partials.dtype} do not match the "
                         f"output {out.shape} {out.dtype} (float32/float64, C order)")
    return partials, partials.shape[0], out.size


def bias_relu(y, bias, *, relu: bool, aux_rows: int | None, partials=None):
    """``y = act(y + bias)`` in place for a C-contiguous (B, F) ``y``; returns ``(y, aux)``,
    aux the (aux_rows, B) column-major relu_aux when ``aux_rows`` is given. With
    ``partials`` (S, B, F), ``y`` is written from their sum (in split order) instead."""
    batch, features = y.shape
    src, splits, pstride = _split_source(y, partials)
    buf = cupy.empty((batch, aux_rows), dtype=cupy.uint8) if aux_rows is not None else None
    per = aux_rows if aux_rows is not None else features // 8
    if batch * per:
        kern = _kernel("bias_relu", y.dtype, HAS_BIAS=bias is not None,
                       HAS_AUX=aux_rows is not None, RELU=relu, SPLITS=splits)
        kern((-(-batch * per // 256),), (256,),
             (y, bias if bias is not None else np.uintp(0),
              buf if buf is not None else np.uintp(0), np.int64(batch), np.int64(features),
              np.int64(aux_rows or 0), src, np.int64(pstride)))
    return y, (buf.T if buf is not None else None)


#: Rows whose loads a ``drelu`` thread issues before it stores any (one per row before).
DRELU_UNROLL = 4
#: The bias gradient's chunk partials added by the last block of each column range (one
#: launch) rather than by ``sum_chunks`` (two); False only for benchmarks' comparisons.
DRELU_TICKET = True
#: Per dtype, the chunk partials whose loads each thread of the tail issues together: as
#: many as keep the kernel's registers (ptxas, sm_90) where they were without the tail:
#: float32 96 (95 before), float16 80 (78; 32 loads took it to 96, from 3 blocks per SM to
#: 2). float64 has none and keeps the second launch: its tail took it from 128 registers to
#: 142-155, from 2 blocks per SM to 1.
DRELU_TAIL = {np.dtype(np.float32): 32, np.dtype(np.float16): 16, bfloat16: 16}


def drelu(dx, aux, ld: int, *, bgrad: bool, partials=None):
    """In place: ``dx *= relu'(aux)`` for a C-contiguous (B, F) ``dx`` (aux column n at
    byte ``n * ld``); returns ``(dx, dbias or None)``, dbias the column sums of the result.
    With ``partials`` (S, B, F), ``dx`` is written from their sum (in split order)."""
    return _activation_grad(dx, aux, ld, bgrad=bgrad, partials=partials, gelu=False)


def dgelu(dx, aux, ld: int, *, bgrad: bool, partials=None):
    """As ``drelu`` with ``dx *= gelu'(aux)``: aux is the gelu_aux, column n at element
    ``n * ld`` (``ld`` a multiple of 8, the buffer 8-element aligned)."""
    if not gelu_aux_vectorizable(aux, ld):
        raise ValueError(f"dgelu: the gelu_aux needs 8-element aligned columns, got leading "
                         f"dimension {ld}")
    return _activation_grad(dx, aux, ld, bgrad=bgrad, partials=partials, gelu=True)


def bias_gelu(y, bias, *, aux: bool, partials=None):
    """``gelu(y + bias)`` for a C-contiguous (B, F) ``y``, or from the sum of ``partials``
    (S, B, F) in split order; returns ``(out, aux)``. Without ``aux`` ``out`` is ``y``
    (in place); with it the pre-activation stays in ``y``, returned as the (F, B)
    column-major gelu_aux (leading dimension F), and ``out`` is a new array."""
    batch, features = y.shape
    src, splits, pstride = _split_source(y, partials)
    out = cupy.empty_like(y) if aux else y
    if batch * features:
        kern = _kernel("bias_gelu", y.dtype, HAS_BIAS=bias is not None, HAS_AUX=aux,
                       SPLITS=splits)
        kern((-(-batch * features // 8 // 256),), (256,),
             (y if partials is None else src, np.int64(pstride),
              bias if bias is not None else np.uintp(0), out, y if aux else np.uintp(0),
              np.int64(batch), np.int64(features)))
    return out, (y.T if aux else None)


def _activation_grad(dx, aux, ld, *, bgrad, partials, gelu):
    batch, features = dx.shape
    src, splits, pstride = _split_source(dx, partials)
    # 8 columns per thread; 1 row each on short batches (latency), more on long ones
    rpt, chunks = S.row_chunks(batch, min(32, max(1, batch // 512)))
    db = cupy.empty(features, dtype=dx.dtype) if bgrad else None
    part = cupy.empty((chunks, features), dtype=accumulation(dx.dtype)) if bgrad and chunks > 1 \
        else None
    if not batch or not features:
        if bgrad:
            db.fill(0)
        return dx, db
    blocks = -(-features // 256)
    ticket = part is not None and DRELU_TICKET and blocks <= tickets.SIZE and \
        dx.dtype in DRELU_TAIL
    kern = _kernel("drelu", dx.dtype, BGRAD=bgrad, UNROLL=DRELU_UNROLL, SPLITS=splits,
                   TICKET=ticket, GELU=gelu)
    kern((blocks, chunks), (32, 8),
         (dx, aux, part if part is not None else np.uintp(0), db if bgrad else np.uintp(0),
          np.int64(batch), np.int64(features), np.int64(ld), np.int32(rpt), src,
          np.int64(pstride), tickets.counters(blocks) if ticket else np.uintp(0)))
    if part is not None and not ticket:
        S.sum_chunks(part, db, None, 1, features, features)
    return dx, db
