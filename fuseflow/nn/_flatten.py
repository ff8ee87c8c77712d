"""Flatten: (batch, d1, d2, ...) -> (batch, d1*d2*...), a free reshape."""

from __future__ import annotations

import math

import numpy as np

from fuseflow.nn._layer import (Layer, as_rows, as_shape, check_array, check_residuals,
                                check_saved_shape)


class Flatten(Layer):
    def init(self, key, in_shape):
        return (int(np.prod(as_shape(self, in_shape))),), {}

    def forward(self, params, x, *, key=None, train=True):
        check_array(self, x)
        if x.ndim < 1:
            raise self.error("expected input of shape (batch, d1, d2, ...), got a 0-d array. "
                             "Fix: pass a batch, x[i:j] rather than x[i].")
        return as_rows(x), {"shape": tuple(x.shape)}

    def backward(self, params, residuals, dy):
        check_residuals(self, residuals, "shape", cause="they come from another layer")
        shape = tuple(residuals["shape"])
        check_saved_shape(self, dy, (shape[0], math.prod(shape[1:])))
        return {}, dy.reshape(shape)
