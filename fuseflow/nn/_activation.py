"""ReLU and GELU as layers of their own.

Inside ``Serial`` a ReLU/GELU right after a Dense is fused into that Dense's epilog and never
runs here; standing alone (after a LayerNorm, say) it runs as one elementwise kernel that
writes the same relu_aux/gelu_aux format the fused epilog would.
"""

from __future__ import annotations

from fuseflow import backend
from fuseflow.backend.epilogs import AUX_KEYS
from fuseflow.nn._layer import Layer


class _Activation(Layer):
    activation = None

    def init(self, key, in_shape):
        return tuple(in_shape), {}

    def forward(self, params, x, *, key=None, train=True):
        if getattr(x, "ndim", 0) < 2:
            raise self.error(f"expected input of shape (batch, features), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        be = backend.of(x, where=repr(self))
        y, aux = be.activation(x.reshape(len(x), -1), self.activation, want_aux=train)
        return y.reshape(x.shape), ({AUX_KEYS[self.activation]: aux} if train else {})

    def backward(self, params, residuals, dy):
        key = AUX_KEYS[self.activation]
        if not isinstance(residuals, dict) or key not in residuals:
            raise self.error(f"residuals have no {key}: they come from an inference forward "
                             "(train=False) or from another layer. Fix: forward(params, x, "
                             "train=True) and pass its residuals.")
        be = backend.of(dy, where=repr(self))
        try:
            dx = be.activation_grad(dy.reshape(len(dy), -1), self.activation, residuals[key])
        except backend.BackendError as e:
            raise self.error(f"{e}. Fix: pass the residuals of the forward call that produced "
                             "this output.") from None
        return {}, dx.reshape(dy.shape)


class ReLU(_Activation):
    """``max(x, 0)``; the gradient passes where ``x >= 0`` (cuBLASLt's rule, see docs)."""
    activation = "relu"


class GELU(_Activation):
    """GELU, tanh approximation (the one cuBLASLt's GELU epilogs compute)."""
    activation = "gelu"
