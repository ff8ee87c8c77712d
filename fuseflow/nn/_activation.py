"""ReLU and GELU as layers of their own.

Inside ``Serial`` a ReLU/GELU right after a Dense is fused into that Dense's epilog and never
runs here; standing alone (after a LayerNorm, say) it runs as one elementwise kernel that
writes the same relu_aux/gelu_aux format the fused epilog would.
"""

from __future__ import annotations

import numpy as np

from fuseflow import backend
from fuseflow.backend.epilogs import AUX_KEYS
from fuseflow.nn._layer import (Layer, as_rows, as_shape, check_dtype, check_float,
                                check_residuals, check_saved_shape)


class _Activation(Layer):
    """Residuals: the aux, and the input's shape and dtype (host metadata, no device array).
    relu_aux alone cannot give backward the width: it is padded to whole 16-byte rows."""
    activation = None

    def init(self, key, in_shape):
        return as_shape(self, in_shape), {}

    def forward(self, params, x, *, key=None, train=True):
        check_float(self, x)
        if x.ndim < 2:
            raise self.error(f"expected input of shape (batch, features), got {tuple(x.shape)}. "
                             "Fix: keep the batch axis, x.reshape(1, -1) for one sample.")
        be = backend.of(x, where=repr(self))
        y, aux = be.activation(as_rows(x), self.activation, want_aux=train)
        if not train:
            return y.reshape(x.shape), {}
        return y.reshape(x.shape), {AUX_KEYS[self.activation]: aux, "shape": tuple(x.shape),
                                    "dtype": x.dtype.name}

    def backward(self, params, residuals, dy):
        key = AUX_KEYS[self.activation]
        check_residuals(self, residuals, key, "shape", "dtype")
        check_saved_shape(self, dy, residuals["shape"])
        dtype = np.dtype(residuals["dtype"])
        check_dtype(self, dy, dtype, what="dy", fix=f"dy.astype({dtype}), the dtype of this "
                    "layer's input and output.")
        be = backend.of(dy, residuals[key], where=repr(self))
        try:
            dx = be.activation_grad(as_rows(dy), self.activation, residuals[key])
        except backend.BackendError as e:
            if isinstance(e, MemoryError):  # out of GPU memory: not a residuals problem
                raise
            raise self.error(f"{e}. Fix: pass the residuals of the forward call that produced "
                             "this output.") from None
        return {}, dx.reshape(dy.shape)


class ReLU(_Activation):
    """``max(x, 0)``; the gradient passes where ``x >= 0`` (cuBLASLt's rule, see docs)."""
    activation = "relu"


class GELU(_Activation):
    """GELU, tanh approximation (the one cuBLASLt's GELU epilogs compute)."""
    activation = "gelu"
