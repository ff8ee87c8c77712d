"""LayerNorm over the feature axis, in array code that runs on NumPy and CuPy alike."""

from __future__ import annotations

import numpy as np

from fuseflow import backend
from fuseflow.nn._layer import Layer, check_2d


class LayerNorm(Layer):
    def __init__(self, eps=1e-5, use_scale=True, use_bias=True, param_dtype=np.float32):
        self.eps, self.use_scale, self.use_bias = float(eps), use_scale, use_bias
        self.param_dtype = np.dtype(param_dtype)

    def __repr__(self):
        return "LayerNorm()"

    def init(self, key, in_shape):
        (f,) = in_shape
        params = {}
        if self.use_scale:
            params["scale"] = np.ones((f,), self.param_dtype)
        if self.use_bias:
            params["bias"] = np.zeros((f,), self.param_dtype)
        return (f,), params

    def forward(self, params, x, *, key=None, train=True):
        width = next(iter(params.values())).shape[0] if params else None
        check_2d(self, x, width)
        xp = backend.namespace(x)
        backend.of(x, *params.values(), where=repr(self))
        xf = x.astype(xp.float32) if x.dtype == xp.float16 else x
        mean = xf.mean(axis=1, keepdims=True)
        centered = xf - mean
        rstd = 1.0 / xp.sqrt((centered * centered).mean(axis=1, keepdims=True) + self.eps)
        xhat = centered * rstd
        y = xhat
        if self.use_scale:
            y = y * params["scale"]
        if self.use_bias:
            y = y + params["bias"]
        return y.astype(x.dtype, copy=False), {"xhat": xhat, "rstd": rstd}

    def backward(self, params, residuals, dy):
        xhat, rstd = residuals["xhat"], residuals["rstd"]
        if xhat.shape != dy.shape:
            raise self.error(f"dy has shape {dy.shape} but the residuals were saved for "
                             f"{xhat.shape}: residuals from another batch or layer.")
        dyf = dy.astype(xhat.dtype, copy=False)
        grads = {}
        if self.use_scale:
            grads["scale"] = (dyf * xhat).sum(axis=0).astype(params["scale"].dtype)
        if self.use_bias:
            grads["bias"] = dyf.sum(axis=0).astype(params["bias"].dtype)
        dxhat = dyf * params["scale"] if self.use_scale else dyf
        dx = rstd * (dxhat - dxhat.mean(axis=1, keepdims=True)
                     - xhat * (dxhat * xhat).mean(axis=1, keepdims=True))
        return grads, dx.astype(dy.dtype, copy=False)
