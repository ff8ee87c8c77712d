"""LayerNorm over the feature axis, in array code that runs on NumPy and CuPy alike."""

from __future__ import annotations

import math

import numpy as np

from fuseflow import backend
from fuseflow._dtypes import is_half
from fuseflow.nn._layer import (RESIDUALS_FIX, Layer, check_2d, check_array, check_dtype,
                                check_float, check_in_shape, check_keys, check_param,
                                check_residuals, check_saved_shape, float_dtype, number)

_F32 = np.dtype(np.float32)


class LayerNorm(Layer):
    """Computes in the params' dtype; float16 input with float32 params is computed in
    float32 and comes back as float16."""

    def __init__(self, eps=1e-5, use_scale=True, use_bias=True, param_dtype=np.float32):
        self.eps = number(LayerNorm, "eps", eps, lambda e: 0 < e < math.inf,
                          "a positive number (added to the variance before its square root)",
                          "LayerNorm(eps=1e-5).")
        self.use_scale, self.use_bias = bool(use_scale), bool(use_bias)
        self.param_dtype = float_dtype(LayerNorm, param_dtype,
                                       "LayerNorm(param_dtype=np.float32).")

    def __repr__(self):
        args = [f"eps={self.eps!r}"] if self.eps != 1e-5 else []
        args += [f"{k}=False" for k in ("use_scale", "use_bias") if not getattr(self, k)]
        if self.param_dtype != _F32:
            args.append(f"param_dtype={self.param_dtype.name}")
        return f"LayerNorm({', '.join(args)})"

    def init(self, key, in_shape):
        (f,) = check_in_shape(self, in_shape)
        params = {}
        if self.use_scale:
            params["scale"] = np.ones((f,), self.param_dtype)
        if self.use_bias:
            params["bias"] = np.zeros((f,), self.param_dtype)
        return (f,), params

    def check_params(self, params):
        """``(width, dtype)`` of the params (None, None without any)."""
        names = [k for k, on in (("scale", self.use_scale), ("bias", self.use_bias)) if on]
        check_keys(self, params, names)
        width = dtype = None
        for name in names:
            check_param(self, params, name, (width or "features",), dtype, dtype_of=names[0])
            width, dtype = params[name].shape[0], params[name].dtype
        return width, dtype

    def _check_compute_dtype(self, a, dtype, what):
        """``a`` in the dtype the layer computes in, or 16-bit when that is float32."""
        if not (is_half(a.dtype) and dtype == _F32):
            check_dtype(self, a, dtype, what)

    def forward(self, params, x, *, key=None, train=True):
        width, dtype = self.check_params(params)
        check_2d(self, x, width)
        check_float(self, x)
        if dtype is not None:
            self._check_compute_dtype(x, dtype, "input")
        xp = backend.namespace(x)
        backend.of(x, *params.values(), where=repr(self))
        xf = x.astype(xp.float32) if is_half(x.dtype) else x
        if self.eps < 1e-44 and xf.dtype == _F32 and _F32.type(self.eps) == 0:
            raise self.error("eps rounds to 0 in float32, the dtype this input is normalized "
                             "in: a row of equal values would give 0 / 0 = NaN. Fix: eps >= "
                             "1e-44, e.g. LayerNorm(eps=1e-5), or float64 input and params.")
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
        width, _ = self.check_params(params)
        check_residuals(self, residuals, "xhat", "rstd", cause="they come from another layer")
        xhat, rstd = residuals["xhat"], residuals["rstd"]
        check_array(self, xhat, "residuals['xhat']", fix=RESIDUALS_FIX)
        check_array(self, rstd, "residuals['rstd']", fix=RESIDUALS_FIX)
        if xhat.ndim != 2 or (width is not None and xhat.shape[1] != width) \
                or rstd.shape != (xhat.shape[0], 1):
            raise self.error(f"residuals hold a normalized input of shape {tuple(xhat.shape)} "
                             f"and rstd {tuple(rstd.shape)}, but this layer takes (batch, "
                             f"{width or 'features'}) with rstd (batch, 1): residuals from "
                             f"another layer. {RESIDUALS_FIX}")
        check_saved_shape(self, dy, xhat.shape)
        self._check_compute_dtype(dy, xhat.dtype, "dy")
        backend.of(dy, xhat, *params.values(), where=repr(self))
        dyf = dy.astype(xhat.dtype, copy=False)
        # The param grads sum over the batch in float64: NumPy adds the rows of a column
        # one after the other, which in float32 lost 7e-5 (relative) over 4M rows.
        acc = np.float64
        grads = {}
        if self.use_scale:
            grads["scale"] = (dyf * xhat).sum(axis=0, dtype=acc).astype(params["scale"].dtype)
        if self.use_bias:
            grads["bias"] = dyf.sum(axis=0, dtype=acc).astype(params["bias"].dtype)
        dxhat = dyf * params["scale"] if self.use_scale else dyf
        dx = rstd * (dxhat - dxhat.mean(axis=1, keepdims=True)
                     - xhat * (dxhat * xhat).mean(axis=1, keepdims=True))
        return grads, dx.astype(dy.dtype, copy=False)
