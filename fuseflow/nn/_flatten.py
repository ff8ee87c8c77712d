"""Flatten: (batch, d1, d2, ...) -> (batch, d1*d2*...), a free reshape."""

from __future__ import annotations

import numpy as np

from fuseflow.nn._layer import Layer


class Flatten(Layer):
    def init(self, key, in_shape):
        return (int(np.prod(in_shape)),), {}

    def forward(self, params, x, *, key=None, train=True):
        return x.reshape(len(x), -1), {"shape": x.shape}

    def backward(self, params, residuals, dy):
        return {}, dy.reshape(residuals["shape"])
