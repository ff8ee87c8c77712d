"""The output layer fused with its softmax cross-entropy (``Serial.softmax_xent_and_grad``,
which ``ff.value_and_grad`` runs for a Serial ending in a plain Dense): on NumPy it must
give exactly the unfused forward, loss and backward, and its gradients must match central
finite differences in float64. The GPU kernel's tests are in ``test_gpu_head.py``."""

import functools

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn

MODELS = {
    "relu_mlp": lambda: nn.Serial(nn.Dense(24, "relu"), nn.Dense(16, "relu"), nn.Dense(10)),
    "single_dense": lambda: nn.Serial(nn.Dense(7)),
    "relu_layer": lambda: nn.Serial(nn.Dense(24), nn.ReLU(), nn.Dense(5)),
    "gelu_below": lambda: nn.Serial(nn.Dense(24, "gelu"), nn.Dense(10)),
    "dropout_below": lambda: nn.Serial(nn.Dense(24, "relu"), nn.Dropout(0.3), nn.Dense(10)),
    "no_bias": lambda: nn.Serial(nn.Dense(24, "relu", use_bias=False),
                                 nn.Dense(10, use_bias=False)),
    "layernorm_below": lambda: nn.Serial(nn.Dense(24, "relu"), nn.LayerNorm(), nn.Dense(3)),
}


def unfused(logits, labels):
    """softmax_cross_entropy behind a function of its own: value_and_grad cannot fuse it."""
    return ff.losses.softmax_cross_entropy(logits, labels)


def make_problem(model, features, batch, dtype, seed, noise=0.1):
    """``(model, params, x, y)``: the model's init moved by ``noise`` normals (no zero
    biases), a standard normal batch and labels over its outputs."""
    out, params = model.init(ff.random.key(seed), (features,))
    rng = np.random.default_rng(seed)
    params = ff.tree.map(lambda p: (p + noise * rng.standard_normal(p.shape)).astype(dtype),
                         params)
    x = rng.standard_normal((batch, features)).astype(dtype)
    y = rng.integers(0, out[0], batch)
    return model, params, x, y


def problem(name, dtype=np.float32, batch=33, features=20, seed=0):
    return make_problem(MODELS[name](), features, batch, dtype, seed)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_value_and_grad_fuses_and_equals_the_unfused_path(name):
    model, params, x, y = problem(name)
    assert ff.grad.fused_loss_check(model, ff.losses.softmax_cross_entropy) is True
    assert ff.grad.fused_loss_check(model, unfused) is None
    unchecked = functools.partial(ff.losses.softmax_cross_entropy, check=False)
    assert ff.grad.fused_loss_check(model, unchecked) is False  # the CLI's loss
    assert ff.grad.fused_loss_check(model, functools.partial(
        ff.losses.softmax_cross_entropy, grad_dtype=np.float32)) is None
    key = ff.random.key(3)
    (loss, out), grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy,
                                           with_outputs=True)(params, x, y, key=key)
    (loss0, out0), grads0 = ff.value_and_grad(model, unfused, with_outputs=True)(
        params, x, y, key=key)
    assert loss.dtype == loss0.dtype and float(loss) == float(loss0)
    np.testing.assert_array_equal(out, out0)
    assert ff.tree.structure(grads) == ff.tree.structure(grads0)
    for a, b in zip(ff.tree.leaves(grads), ff.tree.leaves(grads0)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["relu_mlp", "single_dense", "relu_layer", "no_bias"])
def test_mixed_precision_fuses_and_equals_the_unfused_path(name):
    model, params, x, y = problem(name)

    def scaled(logits, labels, *, grad_scale=None, grad_dtype=None):  # not fusable, scaled
        return ff.losses.softmax_cross_entropy(logits, labels, grad_scale=grad_scale,
                                               grad_dtype=grad_dtype)

    for unscaled in (True, False):
        got = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, unscaled=unscaled,
                                with_outputs=True)(params, x, y, loss_scale=1024.0)
        want = mp.value_and_grad(model, scaled, unscaled=unscaled, with_outputs=True)(
            params, x, y, loss_scale=1024.0)
        for a, b in zip(ff.tree.leaves(got), ff.tree.leaves(want)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["relu_mlp", "relu_layer", "no_bias", "layernorm_below"])
def test_fused_gradients_match_finite_differences(name):
    """The whole loss in float64, every parameter perturbed by +-eps (a sample of each)."""
    model, params, x, y = problem(name, np.float64, batch=9, features=6, seed=2)
    loss, grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(params, x, y)

    def objective(p):
        out, _ = model.forward(p, x, train=True)
        value, _ = ff.losses.softmax_cross_entropy(out, y)
        return float(value)

    assert abs(float(loss) - objective(params)) <= 1e-12 * max(1.0, abs(float(loss)))
    leaves, treedef = ff.tree.flatten(params)
    rng = np.random.default_rng(0)
    eps = 1e-6
    for j, (leaf, g) in enumerate(zip(leaves, ff.tree.leaves(grads))):
        for idx in rng.choice(leaf.size, min(leaf.size, 12), replace=False):
            idx = np.unravel_index(idx, leaf.shape)
            vals = []
            for sign in (1, -1):
                pert = leaf.copy()
                pert[idx] += sign * eps
                new = list(leaves)
                new[j] = pert
                vals.append(objective(ff.tree.unflatten(treedef, new)))
            numeric = (vals[0] - vals[1]) / (2 * eps)
            assert abs(g[idx] - numeric) <= 1e-6 + 1e-5 * abs(numeric), (j, idx, g[idx],
                                                                          numeric)


def test_which_models_fuse():
    class Passes(nn.Serial):
        def forward(self, params, x, **kw):
            return super().forward(params, x, **kw)

    class MyDense(nn.Dense):
        pass

    assert nn.Serial(nn.Dense(4, "relu"), nn.Dense(3)).softmax_head is not None
    assert nn.Serial(nn.Dense(3)).softmax_head is not None
    assert nn.Serial(nn.Dense(4), nn.Dense(3, "relu")).softmax_head is None  # activation
    assert nn.Serial(nn.Dense(4), nn.Dense(3), nn.ReLU()).softmax_head is None  # absorbed
    assert nn.Serial(nn.Dense(4), nn.Dropout(0.1)).softmax_head is None  # not a Dense
    assert nn.Serial(nn.Dense(4), MyDense(3)).softmax_head is None  # a subclass may differ
    assert Passes(nn.Dense(4), nn.Dense(3)).softmax_head is None  # overridden passes
    assert nn.Serial().softmax_head is None
    with pytest.raises(nn.LayerError, match="needs a plain Dense"):
        nn.Serial(nn.Dense(3, "relu")).softmax_xent_and_grad(
            ({"w": np.ones((3, 2), np.float32), "b": np.zeros(3, np.float32)},),
            np.ones((2, 2), np.float32), np.zeros(2, np.int64))


def test_fused_path_checks_labels_and_params_like_the_unfused():
    model, params, x, y = problem("relu_mlp")
    f = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    with pytest.raises(ff.losses.LossError, match=r"labels must lie in \[0, 10\)"):
        f(params, x, np.full_like(y, 10))
    with pytest.raises(ff.losses.LossError, match="got 33 outputs but 32 labels"):
        f(params, x, y[:-1])
    with pytest.raises(ff.losses.LossError, match="1-D integer array"):
        f(params, x, y.astype(np.float32))
    bad = (params[0], params[1], {"w": params[2]["w"][:, :5], "b": params[2]["b"]})
    with pytest.raises(nn.LayerError, match=r"Serial layer 2 \(Dense\(10\)\)"):
        f(bad, x, y)


@pytest.mark.parametrize("name", ["relu_mlp", "single_dense", "dropout_below"])
def test_weight_gradients_issued_after_the_input_gradient_change_nothing(name, monkeypatch):
    """The overlap order "after" (on the GPU: weight gradients forked once the input
    gradient is issued, the lowest layer's on the main stream) runs other code paths in
    ``ops.dense``; NumPy's backend, told to take them, gives the same numbers."""
    model, params, x, y = problem(name)
    key = ff.random.key(1)
    for loss_fn in (ff.losses.softmax_cross_entropy, unfused):
        f = ff.value_and_grad(model, loss_fn)
        want = f(params, x, y, key=key)
        monkeypatch.setattr(ff.backend.get("numpy"), "wgrad_after_dgrad", lambda dy, x: True)
        got = f(params, x, y, key=key)
        monkeypatch.undo()
        for a, b in zip(ff.tree.leaves(got), ff.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)
