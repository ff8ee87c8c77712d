"""Your own layer: a Swish with a learnable slope per feature, ``y = x * sigmoid(beta * x)``.

A layer is an object holding hyperparameters only, with three pure methods (the contract
is in ``fuseflow/nn/_layer.py``):

    init(key, in_shape)                          -> (out_shape, params)
    forward(params, x, *, key=None, train=True)  -> (y, residuals)
    backward(params, residuals, dy)              -> (grads, dx)

``residuals`` is whatever backward needs, returned rather than stored. The gradient is
checked against finite differences with ``ff.check_grads``, then the layer trains inside a
Serial next to fused Dense layers (Serial runs it as a plain forward/backward pair).

    python examples/02_custom_layer.py
"""

import numpy as np

import fuseflow as ff
from fuseflow import nn


class Swish(nn.Layer):
    def init(self, key, in_shape):
        # beta starts at 1 (the usual SiLU); one slope per feature
        return tuple(in_shape), {"beta": np.ones(in_shape, np.float32)}

    def forward(self, params, x, *, key=None, train=True):
        xp = ff.backend.namespace(x)  # numpy or cupy: the same code runs on both
        s = 1 / (1 + xp.exp(-params["beta"] * x))
        return x * s, ({"x": x, "s": s} if train else {})

    def backward(self, params, residuals, dy):
        x, s, beta = residuals["x"], residuals["s"], params["beta"]
        ds = s * (1 - s)                      # sigmoid'(beta * x)
        dx = dy * (s + x * beta * ds)
        dbeta = (dy * x * x * ds).sum(axis=0)
        return {"beta": dbeta}, dx


# 1. The backward agrees with finite differences (float64, on the host).
layer = Swish()
p = {"beta": ff.random.normal(ff.random.key(1), (5,))}  # random slopes, not just beta = 1
report = ff.check_grads(layer, p, ff.random.normal(ff.random.key(2), (4, 5)))
print(f"check_grads: {report}")

# 2. It trains inside a Serial, between Dense layers.
model = nn.Serial(nn.Dense(64), Swish(), nn.Dense(10))
optimizer = ff.optim.adam(3e-3)
state = ff.train.init_state(model, optimizer, (64,), ff.random.key(0))
step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, optimizer)

x, y = ff.data.digits("train")
x_test, y_test = ff.data.digits("test")
params, opt_state = state.params, state.opt_state
for epoch in range(8):
    for xb, yb in ff.data.batches(x, y, 64, key=ff.random.fold_in(state.data_key, epoch)):
        params, opt_state, metrics = step(params, opt_state, xb, yb)
    print(f"epoch {epoch + 1}: loss {float(metrics['loss']):.4f}")

beta = params[1]["beta"]
print(f"learned beta: mean {beta.mean():.3f}, range [{beta.min():.3f}, {beta.max():.3f}]")
result = ff.train.evaluate(model, params, x_test, y_test)
print(f"test accuracy {result.accuracy:.4f}")
