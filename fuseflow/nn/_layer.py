"""The layer contract, stated once.

A layer is an object holding only hyperparameters, with three pure methods:

    init(key, in_shape)                          -> (out_shape, params)
    forward(params, x, *, key=None, train=True)  -> (y, residuals)
    backward(params, residuals, dy)              -> (grads, dx)

``in_shape``/``out_shape`` exclude the batch dimension; ``x`` is ``(batch, features)``.
``params`` and ``grads`` are pytrees of identical structure. ``residuals`` is what backward
needs (inputs, masks); it belongs to exactly one forward call, one batch. ``key`` is a
``ff.random`` key for layers that draw random numbers (Dropout). With ``train=False`` a layer
may skip writing residuals that only backward needs (no relu_aux in inference).
"""

from __future__ import annotations


class LayerError(ValueError):
    """Bad input to a layer: the message names the layer, what it expected, what came, the fix."""


class Layer:
    #: set by layers whose backward accepts ``need_input_grad=False`` (skips computing dx)
    skips_input_grad = False

    def init(self, key, in_shape):
        raise NotImplementedError

    def forward(self, params, x, *, key=None, train=True):
        raise NotImplementedError

    def backward(self, params, residuals, dy):
        raise NotImplementedError

    def apply(self, params, x, *, key=None):
        """Inference: the output of ``forward(..., train=False)``."""
        return self.forward(params, x, key=key, train=False)[0]

    def __repr__(self):
        return type(self).__name__ + "()"

    def error(self, message: str) -> LayerError:
        return LayerError(f"{self!r}: {message}")


def check_2d(layer, x, width=None, what="input"):
    """Check a (batch, features) array; a LayerError that shows the fix otherwise."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise layer.error(f"{what} must be an array, got {type(x).__name__}. "
                          "Fix: np.asarray(x, dtype=np.float32).")
    if len(shape) != 2 or (width is not None and shape[1] != width):
        want = f"(batch, {width})" if width is not None else "(batch, features)"
        fix = (" Fix: flatten images first, x.reshape(len(x), -1), or add ff.nn.Flatten()."
               if len(shape) > 2 else " Fix: pass a batch of the model's input width"
               " (check the in_shape given to init).")
        raise layer.error(f"expected {what} of shape {want}, got {tuple(shape)}.{fix}")


def check_dtype(layer, x, dtype, what="input"):
    if x.dtype != dtype:
        raise layer.error(f"expected {what} of dtype {dtype}, got {x.dtype}. Fix: "
                          f"x.astype({dtype}), or cast the params with "
                          "ff.tree.astype(params, ...).")
