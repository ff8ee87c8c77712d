"""``ff.random.bits`` and Dropout's factors computed on the GPU, inside a compiled step too.

Philox4x32-10 is counter-based: element i is word ``i % 4`` of the block at counter
``(i // 4, stream, 0)`` under the key, so each thread computes one block from the key and its
index alone. The key is read from device memory, not passed as a kernel argument: a CUDA
graph captures argument values, and a compiled step gets a new key each call (its input
buffer, copied in like the batch). The arithmetic is ``ff.random.philox4x32``'s (32-bit
words, 64-bit products), so the bits are the host's.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow import random
from fuseflow.backend._cuda_fused import _CTYPES, HALF_HEADERS

_SRC = r"""
// SCALE 0: out[i] = the bits; 1: out[i] = bits < threshold ? inv : 0 (Dropout's factor);
// 2: that factor, and y[i] = x[i] * out[i] (Dropout's forward: one pass over x)
extern "C" __global__ void philox_bits(const unsigned int* __restrict__ key, T* __restrict__ out,
                                       unsigned long long n, unsigned int stream,
                                       unsigned long long threshold, double inv,
                                       const T* __restrict__ x, T* __restrict__ y) {
    const unsigned long long blocks = (n + 3) / 4;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         b < blocks; b += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int c0 = (unsigned int)b, c1 = (unsigned int)(b >> 32), c2 = stream, c3 = 0u;
        unsigned int k0 = key[0], k1 = key[1];
        #pragma unroll
        for (int r = 0; r < 10; ++r) {
            if (r) { k0 += W0; k1 += W1; }
            const unsigned long long p0 = (unsigned long long)M0 * c0;
            const unsigned long long p1 = (unsigned long long)M1 * c2;
            const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
            const unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
            c0 = n0; c1 = (unsigned int)p1; c2 = n2; c3 = (unsigned int)p0;
        }
        const unsigned int w[4] = {c0, c1, c2, c3};
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const unsigned long long i = 4 * b + j;
            if (i < n) {
#if SCALE
                const T f = (unsigned long long)w[j] < threshold ? (T)(ACC)inv : (T)(ACC)0;
                out[i] = f;
#if SCALE == 2
                y[i] = x[i] * f;  // one rounding, as the host's x * scale
#endif
#else
                out[i] = w[j];
#endif
            }
        }
    }
}
"""
_THREADS = 256
#: grid cap; larger draws loop (tests lower it to run the grid-stride loop at small sizes)
MAX_BLOCKS = 65535


@functools.cache
def _kernel(ctype: str, mode: int):
    """``mode`` 0: bits; 1: Dropout's factors; 2: the factors and x times them (``SCALE``)."""
    acc = "double" if ctype == "double" else "float"  # exact: the factor is a T value
    defines = (f"{HALF_HEADERS}typedef {ctype} T; typedef {acc} ACC;\n"
               f"#define SCALE {int(mode)}\n"
               f"#define M0 {random.PHILOX_M[0]}u\n#define M1 {random.PHILOX_M[1]}u\n"
               f"#define W0 {random.PHILOX_W[0]}u\n#define W1 {random.PHILOX_W[1]}u\n")
    return cupy.RawKernel(defines + _SRC, "philox_bits")


def bits_or_scale(key, shape, dtype=None, rate=0.0, stream=0, x=None):
    """``ff.random.bits(key, shape, stream)`` (``dtype`` None) or Dropout's factors in ``dtype``
    (``1 / (1 - rate)`` where the bits are below ``keep_threshold(rate)``, else 0), on the
    current stream; ``key`` a (2,) uint32 CuPy array. With ``x`` (C-contiguous, of
    ``shape`` and ``dtype``): ``(x * factors, factors)`` from the same pass."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype is None:
        out, ctype = cupy.empty(shape, dtype=np.uint32), "unsigned int"
    else:
        out, ctype = cupy.empty(shape, dtype=dtype), _CTYPES[np.dtype(dtype)]
    y = None if x is None else cupy.empty_like(x)
    if n:
        # the host's factor, rounded once to the dtype (exact in a double)
        factor = float(random.keep_factor(rate, dtype)) if dtype is not None else 0.0
        blocks = max(1, min(-(-n // (4 * _THREADS)), MAX_BLOCKS))
        null = np.uintp(0)
        mode = 0 if dtype is None else 1 if x is None else 2
        _kernel(ctype, mode)(
            (blocks,), (_THREADS,),
            (key, out, np.uint64(n), np.uint32(stream), np.uint64(random.keep_threshold(rate)),
             np.float64(factor), null if x is None else x, null if y is None else y))
    return out if x is None else (y, out)
