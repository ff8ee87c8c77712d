"""CuPy elementwise kernels for the CUDA backend: the unfused ReLU/GELU paths.

They read and write exactly the formats the cuBLASLt epilogs use (see ``epilogs.py``):

- relu_aux: uint8, column-major ``(round_up(ceil(F/8), 16), batch)``; bit i (LSB first) of
  byte j in column n is feature ``8*j + i`` of sample n, set where the pre-activation is
  ``>= 0``. The pack kernel writes zero padding bytes; the gradient kernel reads only the bits
  of features ``< F`` (cuBLASLt leaves the padding as garbage).
- gelu: the tanh approximation, computed in float32 for float16/float32 and in float64 for
  float64, as ``numpy_backend.gelu``/``gelu_grad`` do.

Every raw operand is passed as a 1-D view (flat index arithmetic is done here, with the
leading dimension given explicitly), so no CuPy stride logic is involved.
"""

from __future__ import annotations

import functools

import cupy

PREAMBLE = r"""
template <typename U> struct ff_acc { typedef float type; };
template <> struct ff_acc<double> { typedef double type; };

template <typename A> __device__ __forceinline__ A ff_gelu(A x) {
    const A k0 = (A)0.7978845608028654;
    const A k1 = (A)0.044715;
    A t = tanh(k0 * (x + k1 * x * x * x));
    return (A)0.5 * x * ((A)1 + t);
}

template <typename A> __device__ __forceinline__ A ff_gelu_grad(A x) {
    const A k0 = (A)0.7978845608028654;
    const A k1 = (A)0.044715;
    A t = tanh(k0 * (x + k1 * x * x * x));
    A u = (A)1 - t * t;  // 0 where tanh saturated: the term is 0 (not 0 * inf = NaN)
    return (A)0.5 * ((A)1 + t)
         + (u == (A)0 ? (A)0 : (A)0.5 * x * u * k0 * ((A)1 + (A)3 * k1 * x * x));
}
"""

# One thread per relu_aux byte (sample n, byte j): reads up to 8 features of row n of the
# row-major (batch, F) pre-activation (plus bias), writes y and the byte.
_RELU_PACK = r"""
typedef ff_acc<T>::type A;
long long n = i / rows;
long long j = i - n * rows;
unsigned int byte = 0u;
if (j < nbytes) {
    long long base = n * F;
    for (int b = 0; b < 8; ++b) {
        long long f = 8 * j + b;
        if (f < F) {
            A v = (A)pre[base + f];
            if (has_bias) v += (A)bias[f];
            if (v >= (A)0) byte |= (1u << b);
            y[base + f] = (T)(v < (A)0 ? (A)0 : v);
        }
    }
}
aux[i] = (unsigned char)byte;
"""

_RELU = r"""
typedef ff_acc<T>::type A;
A v = (A)x;
y = (T)(v < (A)0 ? (A)0 : v);
"""

# One thread per data byte (sample n, byte j < ceil(F/8)): dx[n, f] = dy[n, f] if bit f of
# column n is set, else 0, for the (up to) 8 features of that byte. Column n of the aux starts
# at n * ld bytes; bits of features >= F (padding) are never read.
_RELU_GRAD = r"""
long long n = i / nbytes;
long long j = i - n * nbytes;
unsigned int byte = (unsigned int)aux[n * ld + j];
long long base = n * F + 8 * j;
int nf = (int)(F - 8 * j < 8 ? F - 8 * j : 8);
const T zero = (T)((ff_acc<T>::type)0);
for (int b = 0; b < nf; ++b) {
    dx[base + b] = ((byte >> b) & 1u) ? (T)dy[base + b] : zero;
}
"""

# Column sums of a row-major (B, F) array in two passes: thread (chunk c, column f) sums rows
# [c * rpc, (c + 1) * rpc) of column f in the accumulation type (coalesced across f).
_COL_PARTIAL = r"""
long long c = i / F;
long long f = i - c * F;
long long r0 = c * rpc;
long long r1 = r0 + rpc < B ? r0 + rpc : B;
P s = (P)0;
for (long long r = r0; r < r1; ++r) s += (P)a[r * F + f];
partial[i] = s;
"""

_GELU = r"""
typedef ff_acc<T>::type A;
y = (T)ff_gelu<A>((A)x);
"""

# dx[n, f] = dy[n, f] * gelu'(pre[n, f]); pre is the (F, batch) column-major aux with
# leading dimension ld, i.e. sample n's features start at n * ld elements.
_GELU_GRAD = r"""
typedef ff_acc<T>::type A;
long long n = i / F;
long long f = i - n * F;
A p = (A)pre[n * ld + f];
dx = (T)((A)dy * ff_gelu_grad<A>(p));
"""

SOURCES = {
    "relu_pack": ("raw T pre, raw T bias, int64 F, int64 rows, int64 nbytes, bool has_bias",
                  "raw T y, raw uint8 aux", _RELU_PACK),
    "relu": ("T x", "T y", _RELU),
    "relu_grad": ("raw T dy, raw uint8 aux, int64 F, int64 nbytes, int64 ld", "raw T dx",
                  _RELU_GRAD),
    "col_partial": ("raw T a, int64 B, int64 F, int64 rpc", "raw P partial", _COL_PARTIAL),
    "gelu": ("T x", "T y", _GELU),
    "gelu_grad": ("T dy, raw T pre, int64 F, int64 ld", "T dx", _GELU_GRAD),
}


@functools.cache
def kernel(name: str) -> cupy.ElementwiseKernel:
    in_params, out_params, body = SOURCES[name]
    return cupy.ElementwiseKernel(in_params, out_params, body, "fuseflow_" + name,
                                  preamble=PREAMBLE)


def flat(a, nelem: int):
    """A 1-D view of ``nelem`` elements starting at ``a``'s first element (no copy)."""
    return cupy.ndarray((nelem,), dtype=a.dtype, memptr=a.data)


def relu_pack(pre, bias, rows: int):
    """``(relu(pre + bias), relu_aux)`` for a C-contiguous ``(batch, F)`` pre-activation."""
    batch, features = pre.shape
    y = cupy.empty_like(pre, order="C")
    buf = cupy.empty((batch, rows), dtype=cupy.uint8)  # row-major (batch, rows) == F-order aux
    kernel("relu_pack")(flat(pre, pre.size), flat(pre if bias is None else bias,
                                                    1 if bias is None else bias.size),
                        features, rows, -(-features // 8), bias is not None,
                        flat(y, y.size), flat(buf, buf.size), size=batch * rows)
    return y, buf.T


def relu(x):
    return kernel("relu")(x)


def relu_grad(dy, aux, ld: int):
    """C-contiguous ``dy`` masked by relu_aux (column n at byte offset ``n * ld``)."""
    batch, features = dy.shape
    nbytes = -(-features // 8)
    nelem = (batch - 1) * ld + aux.shape[0] if batch else 0
    dx = cupy.empty_like(dy, order="C")
    if dy.size:
        kernel("relu_grad")(flat(dy, dy.size), flat(aux, max(nelem, 1)), features, nbytes, ld,
                            flat(dx, dx.size), size=batch * nbytes)
    return dx


def sum_rows(a):
    """``a.sum(axis=0)`` of a C-contiguous (B, F) array, accumulated in float32 (float16,
    float32) or float64, returned in ``a``'s dtype."""
    batch, features = a.shape
    acc = cupy.float64 if a.dtype == cupy.float64 else cupy.float32
    if batch == 0 or features == 0:
        return cupy.zeros(features, dtype=a.dtype)
    rpc = 64 if batch > 64 else batch
    chunks = -(-batch // rpc)
    partial = cupy.empty((chunks, features), dtype=acc)
    kernel("col_partial")(flat(a, a.size), batch, features, rpc, flat(partial, partial.size),
                          size=chunks * features)
    out = partial[0] if chunks == 1 else partial.sum(axis=0)
    return out.astype(a.dtype, copy=False)


def gelu(x):
    return kernel("gelu")(x)


def gelu_grad(dy, pre, ld: int):
    """``dy * gelu'(pre)``; pre is the column-major (F, batch) aux with leading dim ``ld``."""
    batch, features = dy.shape
    nelem = (batch - 1) * ld + features if batch else 0
    dx = cupy.empty_like(dy, order="C")
    kernel("gelu_grad")(dy, flat(pre, max(nelem, 1)), features, ld, dx)
    return dx
