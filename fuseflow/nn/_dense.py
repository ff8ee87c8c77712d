"""Dense: a fully connected layer whose activation runs in the matmul's epilog."""

from __future__ import annotations

import numpy as np

from fuseflow import random
from fuseflow.backend.epilogs import AUX_KEYS
from fuseflow.nn import initializers
from fuseflow.nn._layer import (RESIDUALS_FIX, Layer, check_2d, check_array, check_dtype,
                                check_in_shape, check_keys, check_param, check_residuals,
                                float_dtype, initializer, positive_int)
from fuseflow.backend.epilogs import ACTIVATIONS as FUSED_ACTIVATIONS
from fuseflow.ops.dense import dense_backward, dense_forward

ACTIVATIONS = (None, *FUSED_ACTIVATIONS)


class Dense(Layer):
    """``y = activation(x @ w.T + b)`` with ``w`` of shape ``(features, in)``.

    The ``(out, in)`` weight layout is cuBLASLt's: it lets the GPU compute ``y.T = w @ x.T``
    with the bias and activation fused, and no activation ever copied or transposed.
    With ``activation="relu"`` training writes ``relu_aux`` (see ``fuseflow.backend.epilogs``)
    into the residuals.
    """

    skips_input_grad = True

    def __init__(self, features, activation=None, use_bias=True, w_init=None, b_init=None,
                 param_dtype=np.float32):
        features = positive_int(Dense, "features", features,
                                "an int >= 1 (not a bool), e.g. Dense(10) for 10 outputs.")
        if activation not in ACTIVATIONS:
            raise ValueError(f"Dense: activation must be one of {ACTIVATIONS}, got "
                             f"{activation!r}. Fix: Dense({features}, activation='relu').")
        self.features = features
        self.activation = activation
        self.use_bias = bool(use_bias)
        gain = 2.0 if activation else 1.0
        self.w_init = initializer(Dense, "w_init", w_init) or \
            initializers.variance_scaling(gain, "fan_in", "truncated_normal")
        self.b_init = initializer(Dense, "b_init", b_init) or initializers.zeros
        self.param_dtype = float_dtype(Dense, param_dtype,
                                       f"Dense({features}, param_dtype=np.float32).")

    def __repr__(self):
        act = f", activation={self.activation!r}" if self.activation else ""
        bias = "" if self.use_bias else ", use_bias=False"
        return f"{type(self).__name__}({self.features}{act}{bias})"  # a subclass by its name

    def init(self, key, in_shape):
        in_shape = check_in_shape(self, in_shape)
        kw, kb = random.split(key)
        params = {"w": self._draw("w_init", kw, (self.features, in_shape[0]))}
        if self.use_bias:
            params["b"] = self._draw("b_init", kb, (self.features,))
        return (self.features,), params

    def _draw(self, name, key, shape):
        """Call an initializer and check its array: a wrong one would pass init and fail in
        forward, as if the params came from another model."""
        a, dtype = getattr(self, name)(key, shape, self.param_dtype), self.param_dtype
        fix = (f"Fix: {name} is called as init(key, shape, dtype) and must return an array of "
               "that shape and dtype")
        check_array(self, a, f"{name}'s result", fix=fix + ", e.g. np.asarray(a, dtype).")
        if a.shape != shape:
            layout = " = (out, in)" if name == "w_init" else ""
            raise self.error(f"{name} returned shape {tuple(a.shape)}, expected {shape}{layout}. "
                             f"{fix}.")
        if a.dtype != dtype:
            raise self.error(f"{name} returned dtype {a.dtype}, expected {dtype} (param_dtype). "
                             f"{fix}: return a.astype(dtype).")
        return a

    def check_params(self, params, x=None):
        check_keys(self, params, {"w", "b"} if self.use_bias else {"w"})
        check_param(self, params, "w", (self.features, "in"))
        w = params["w"]
        if self.use_bias:
            check_param(self, params, "b", (self.features,), w.dtype, dtype_of="w")
        if x is not None:
            check_2d(self, x, w.shape[1])
            check_dtype(self, x, w.dtype)

    def forward(self, params, x, *, key=None, train=True, activation=None):
        """``activation`` overrides the layer's own (Serial fuses a following ReLU/GELU so)."""
        self.check_params(params, x)
        return dense_forward(params, x, activation=activation or self.activation, train=train,
                             where=repr(self))

    def check_residuals(self, params, residuals, dy_or_dpre, activation):
        check_residuals(self, residuals, "x", cause="they come from another layer")
        x, w = residuals["x"], params["w"]
        check_array(self, x, "residuals['x']", fix=RESIDUALS_FIX)
        if x.ndim != 2 or x.shape[1] != w.shape[1]:
            raise self.error(f"residuals hold an input of shape {x.shape} but this layer takes "
                             f"(batch, {w.shape[1]}): residuals from another layer.")
        if x.dtype != w.dtype:
            raise self.error(f"residuals hold an input of dtype {x.dtype} but params['w'] is "
                             f"{w.dtype}: residuals of a forward with other params. Fix: run "
                             "forward and backward with the same params (cast them with "
                             "ff.tree.astype before the forward, not between).")
        check_2d(self, dy_or_dpre, self.features, what="dy")
        if dy_or_dpre.shape[0] != x.shape[0]:
            raise self.error(f"dy has batch {dy_or_dpre.shape[0]} but the residuals were saved "
                             f"for batch {x.shape[0]}: residuals from another batch. Fix: pass "
                             "the residuals of the forward call that produced this output.")
        check_dtype(self, dy_or_dpre, w.dtype, what="dy")
        if activation:
            check_residuals(self, residuals, AUX_KEYS[activation],
                            cause="they come from an inference forward (train=False) or another "
                                  "layer")

    def backward(self, params, residuals, dy, *, need_input_grad=True):
        """``(grads, dx)``; with ``need_input_grad=False`` dx is None and its matmul is skipped."""
        grads, dx, _ = self.backward_fused(params, residuals, dy, need_input_grad=need_input_grad)
        return grads, dx

    def backward_fused(self, params, residuals, dy=None, *, need_input_grad=True,
                       activation=None, pre_grad=None, input_activation=None, input_aux=None,
                       input_has_bias=False, release_input=False, overlap_wgrad=False):
        """The fusion engine's entry (see Serial): ``(grads, dx, input_bias_grad)``.

        ``pre_grad=(dpre, db)`` replaces dy when the layer above already applied this layer's
        activation derivative; ``input_activation``/``input_aux`` make the input-gradient
        matmul apply the lower layer's activation derivative and bias sum.
        ``overlap_wgrad``: see ``ops.dense.dense_backward``.
        """
        activation = activation or self.activation
        self.check_params(params)
        self.check_residuals(params, residuals, dy if pre_grad is None else pre_grad[0],
                             None if pre_grad is not None else activation)
        if input_activation and input_aux is None:
            key = AUX_KEYS[input_activation]
            raise self.error(f"the layer below has no {key} in its residuals: they come from an "
                             "inference forward (train=False) or another model. Fix: "
                             "forward(params, x, train=True) and pass its residuals.")
        return dense_backward(params, residuals, dy, activation=activation, pre_grad=pre_grad,
                              input_activation=input_activation, input_aux=input_aux,
                              input_has_bias=input_has_bias, need_input_grad=need_input_grad,
                              release_input=release_input, overlap_wgrad=overlap_wgrad)
