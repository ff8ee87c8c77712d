"""The NumPy backend: the unfused, readable reference for every epilog.

It computes what cuBLASLt's epilogs compute, in the same formats (relu_aux packing, the
``>= 0`` rule, GELU's tanh approximation), one plain NumPy step at a time: the ReLU
epilogs and bias gradients to the bit, the GELU ones to cuBLASLt's own approximation of
the formula (docs/gpu.md, 5e-6 in float32). The GPU backend is tested against it.
"""

from __future__ import annotations

import numpy as np

from fuseflow._dtypes import FLOATS, accumulation, is_half
from fuseflow.backend.base import Backend, from_dlpack
from fuseflow.backend.epilogs import relu_aux_rows

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_C = 0.044715


def pack_relu_aux(pre: np.ndarray) -> np.ndarray:
    """relu_aux for a row-major ``(batch, F)`` pre-activation, in cuBLASLt's format.

    The result is a column-major ``(round_up(ceil(F/8), 16), batch)`` uint8 array: a
    row-major ``(batch, rows)`` buffer seen transposed, so each sample's bytes are contiguous.
    Padding bytes are zero here (on the GPU they are garbage and must never be read).
    """
    batch, features = pre.shape
    buf = np.zeros((batch, relu_aux_rows(features)), dtype=np.uint8)
    buf[:, : -(-features // 8)] = np.packbits(pre >= 0, axis=1, bitorder="little")
    return buf.T


def unpack_relu_aux(aux: np.ndarray, features: int) -> np.ndarray:
    """Boolean ``(batch, F)`` mask from relu_aux; reads only the first F bits of each column."""
    return np.unpackbits(aux.T, axis=1, count=features, bitorder="little").view(bool)


def gelu(x):
    """GELU, tanh approximation (the formula cuBLASLt's GELU epilogs approximate)."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x * x * x)))


def gelu_grad(x):
    """Where tanh has saturated (1 - t^2 == 0) the second term is 0, written as such: for
    |x| whose square overflows, 0 * inf would make it NaN (the limits are 1 and 0)."""
    t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x * x * x))
    u = 1.0 - t * t
    with np.errstate(over="ignore", invalid="ignore"):
        slope = 0.5 * x * u * _SQRT_2_OVER_PI * (1.0 + 3 * _GELU_C * x * x)
    return 0.5 * (1.0 + t) + np.where(u == 0, np.zeros_like(slope), slope)


class NumpyBackend(Backend):
    name = "numpy"
    device = "cpu"
    xp = np
    dtypes = FLOATS

    # ---- dense matmuls ---------------------------------------------------------------------
    # The batch-side operands are made C-contiguous first (a no-op for the usual arrays): BLAS
    # takes a transposed or strided one by another kernel, whose sums round differently
    # (NumPy 2.2 gave a transposed view's forward 1-ulp differences), and a layer's result
    # should not depend on its input's layout.
    def _linear(self, x, w, bias, spec):
        # Accumulate, add the bias and apply the activation before the one final rounding.
        # ``pre`` is a fresh array, so the bias and ReLU are applied in place.
        pre = _mm(np.ascontiguousarray(x), w.T)
        if spec.bias:
            pre += bias.astype(pre.dtype, copy=False)
        if spec.activation == "relu":
            aux = pack_relu_aux(pre) if spec.aux else None
            np.maximum(pre, 0, out=pre)
            return pre.astype(x.dtype, copy=False), aux
        if spec.activation == "gelu":
            y = gelu(pre).astype(x.dtype, copy=False)
            return y, (pre.T.astype(x.dtype, copy=False) if spec.aux else None)
        return pre.astype(x.dtype, copy=False), None

    def _linear_dgrad(self, dy, w, spec, aux):
        prod = _mm(np.ascontiguousarray(dy), w)
        if spec.activation == "gelu":
            # times gelu'(pre) before the one final rounding, as the forward epilogs and
            # cuBLASLt's DGELU round (the CUDA backend's unfused fallback, K == 1, rounds
            # the float16 product first: 1 ulp apart, within the float16 tolerance)
            dx = (prod * gelu_grad(aux.T.astype(prod.dtype))).astype(dy.dtype, copy=False)
        else:
            dx = prod.astype(dy.dtype, copy=False)  # masking commutes with the rounding
            if spec.activation == "relu":
                _relu_mask_in_place(dx, aux)
        return dx, (self._sum_rows(dx) if spec.bias else None)

    def _linear_wgrad(self, dy, x, spec):
        dy = np.ascontiguousarray(dy)  # the bias sum too: its float64 sum follows the layout
        dw = _mm(dy.T, np.ascontiguousarray(x)).astype(dy.dtype, copy=False)
        return dw, (self._sum_rows(dy) if spec.bias else None)

    # ---- activations -----------------------------------------------------------------------
    def _activation(self, x, activation, want_aux):
        if activation == "relu":  # in float32 for 16-bit x, as the fused forward: NumPy's
            # float16 maximum keeps -0.0 where float32's gives +0.0
            y = np.maximum(x.astype(accumulation(x.dtype), copy=False), 0).astype(x.dtype)
            return y, (pack_relu_aux(x) if want_aux else None)
        y = gelu(x.astype(accumulation(x.dtype))).astype(x.dtype)  # "gelu" (base checked the name)
        return y, (x.T if want_aux else None)

    def _activation_grad(self, dy, activation, aux):
        if activation == "relu":
            dx = dy.copy()
            _relu_mask_in_place(dx, aux)
            return dx
        pre = aux.T.astype(accumulation(dy.dtype))
        return (dy.astype(pre.dtype) * gelu_grad(pre)).astype(dy.dtype)

    def _sum_rows(self, a):
        """Column sums (bias gradients) in float64, rounded once: NumPy adds the rows of an
        axis-0 sum one after another (no pairwise summation across rows), which in float32
        drifted by 3e-5 (relative) over 2^21 rows."""
        return a.sum(axis=0, dtype=np.float64).astype(a.dtype)

    # ---- placement -------------------------------------------------------------------------
    def asarray(self, x, dtype=None):
        if type(x).__module__.startswith("cupy"):
            x = x.get()
        elif hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
            x = from_dlpack(np.from_dlpack, x)
        return np.asarray(x, dtype=dtype)

    def to_numpy(self, x):
        return self.asarray(x)


def _relu_mask_in_place(dx, aux):
    """Zero ``dx`` where relu_aux's bit is clear: ``mask ? dx : +0``, as the CUDA backend's
    kernels select. The select is a multiply of each value's bits by the 0/1 mask: exact
    for every value (inf and NaN kept where the bit is set, no inf * 0 = NaN, no -0.0
    where it is clear, which a float multiply by the mask would leave)."""
    bits = dx.view(f"u{dx.itemsize}")
    np.multiply(bits, unpack_relu_aux(aux, dx.shape[1]), out=bits)


def _mm(a, b):
    """Matmul in the accumulation dtype (float32 for 16-bit operands, as on the GPU)."""
    if is_half(a.dtype):
        return a.astype(np.float32) @ b.astype(np.float32)
    return a @ b
