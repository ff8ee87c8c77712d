"""Dropout: zero each input with probability ``rate`` in training, scale the rest by 1/(1-rate).

The mask comes from ``ff.random.bits`` (counter-based), computed where ``x`` is: on the GPU
by one kernel that reads the key from device memory and writes the output and the saved
factor in one pass, so a compiled step (``ff.compile``) can draw a new mask each call from
a key passed to it as a GPU array. The same key gives the same mask on every backend.
"""

from __future__ import annotations

from fuseflow import backend
from fuseflow.nn._layer import (Layer, as_shape, check_array, check_dtype, check_float,
                                check_residuals, check_saved_shape, number)


class Dropout(Layer):
    draws_random = True

    def __init__(self, rate):
        self.rate = number(Dropout, "rate", rate, lambda r: 0.0 <= r < 1.0,
                           "a number in [0, 1) (the fraction of inputs zeroed in training)",
                           "Dropout(0.1) zeroes 10% of the inputs.")

    def __repr__(self):
        return f"Dropout({self.rate})"

    def init(self, key, in_shape):
        return as_shape(self, in_shape), {}

    def forward(self, params, x, *, key=None, train=True):
        check_float(self, x)
        if not train or self.rate == 0.0:
            return x, {}
        if key is None:
            raise self.error("training needs a random key. Fix: forward(params, x, "
                             "key=ff.random.key(step)) or train=False for inference.")
        be = backend.of(x, where=repr(self))
        try:
            y, scale = be.dropout(key, x, self.rate)
        except (TypeError, ValueError) as e:  # a bad key, or a host key inside a capture
            raise self.error(str(e)) from None
        return y, {"scale": scale}

    def backward(self, params, residuals, dy):
        check_array(self, dy, "dy")
        if isinstance(residuals, dict) and not residuals:  # inference or rate 0: identity
            return {}, dy
        check_residuals(self, residuals, "scale", cause="they come from another layer")
        scale = residuals["scale"]
        check_saved_shape(self, dy, scale.shape)
        check_dtype(self, dy, scale.dtype, what="dy", fix=f"dy.astype({scale.dtype}), the dtype "
                    "of this layer's input and output.")
        return {}, dy * scale
