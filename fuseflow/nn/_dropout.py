"""Dropout: zero each input with probability ``rate`` in training, scale the rest by 1/(1-rate)."""

from __future__ import annotations

from fuseflow import backend, random
from fuseflow.nn._layer import Layer


class Dropout(Layer):
    def __init__(self, rate):
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"Dropout: rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def __repr__(self):
        return f"Dropout({self.rate})"

    def init(self, key, in_shape):
        return tuple(in_shape), {}

    def forward(self, params, x, *, key=None, train=True):
        if not train or self.rate == 0.0:
            return x, {}
        if key is None:
            raise self.error("training needs a random key. Fix: forward(params, x, "
                             "key=ff.random.key(step)) or train=False for inference.")
        be = backend.of(x, where=repr(self))
        keep = random.bernoulli(key, 1.0 - self.rate, x.shape)
        scale = be.asarray(keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.rate)))
        return x * scale, {"scale": scale}

    def backward(self, params, residuals, dy):
        if not residuals:  # inference or rate 0: identity
            return {}, dy
        scale = residuals["scale"]
        if scale.shape != dy.shape:
            raise self.error(f"dy has shape {dy.shape} but the residuals were saved for "
                             f"{scale.shape}: residuals from another batch or layer.")
        return {}, dy * scale
