"""The usability audit's findings: each bad use fails where the mistake is, with a message that
names the layer (and its position in a Serial), the shapes or dtypes, and the fix.

Sizes and inputs are drawn fresh on every run, as in tests/test_layer_errors.py."""

import re

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow.nn import LayerError

rng = np.random.default_rng()


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def size(lo=2, hi=40):
    return int(rng.integers(lo, hi))


def two_sizes():
    """Two different sizes: a transposed shape must not match by chance."""
    a = size()
    return a, a + size(1, 10)


def key():
    return ff.random.key(int(rng.integers(1 << 30)))


def raises(exc, *parts):
    """``pytest.raises`` whose message holds ``parts`` in this order (each taken literally)."""
    return pytest.raises(exc, match=".*".join(map(re.escape, parts)))


class Linear(nn.Layer):
    """``y = x @ w.T + b``, a custom (generic) layer; ``bad`` names the one thing it gets wrong."""

    def __init__(self, features, bad=None):
        self.features, self.bad = features, bad

    def __repr__(self):
        return f"Linear({self.features})"

    def init(self, key, in_shape):
        out = self.features + (1 if self.bad == "declares_wider" else 0)
        params = {"w": ff.random.normal(key, (self.features, in_shape[0])),
                  "b": np.zeros(self.features, np.float32)}
        return (out,), params

    def forward(self, params, x, *, key=None, train=True):
        y = x @ params["w"].T + params["b"]
        return (y.astype(np.float64) if self.bad == "float64_y" else y), {"x": x}

    def backward(self, params, residuals, dy):
        x, w = residuals["x"], params["w"]
        dw, db, dx = dy.T @ x, dy.sum(0), dy @ w
        if self.bad == "transposed_dw":
            dw = x.T @ dy
        elif self.bad == "keepdims_db":
            db = dy.sum(0, keepdims=True)
        elif self.bad == "scalar_db":
            db = dy.sum()
        elif self.bad == "float32_dw":
            dw = dw.astype(np.float32)
        elif self.bad == "narrow_dx":
            dx = dx[:, :-1]
        elif self.bad == "float64_dx":
            dx = dx.astype(np.float64)
        elif self.bad == "no_db":
            return {"w": dw}, dx
        return {"w": dw, "b": db}, dx


# ---- 1. check_grads checks the shapes and dtypes of grads and dx ---------------------------
@pytest.mark.parametrize("bad,leaf,got", [
    ("transposed_dw", "w", lambda out, inp, batch: (inp, out)),
    ("keepdims_db", "b", lambda out, inp, batch: (1, out)),
    ("scalar_db", "b", lambda out, inp, batch: ()),
])
def test_check_grads_gradient_of_another_shape(bad, leaf, got):
    out, inp = two_sizes()
    batch = size()
    layer = Linear(out, bad)
    _, p = layer.init(key(), (inp,))
    want = p[leaf].shape
    with raises(ff.GradientCheckError, f"Linear({out}): backward's grads['{leaf}'] has shape "
                f"{got(out, inp, batch)} but params['{leaf}'] has {want}",
                f"Fix: return the gradient with respect to params['{leaf}'] in params['{leaf}']'s "
                "shape"):
        ff.check_grads(layer, p, randn(batch, inp))


def test_check_grads_dx_of_another_shape():
    out, inp = two_sizes()
    batch = size()
    layer = Linear(out, "narrow_dx")
    _, p = layer.init(key(), (inp,))
    with raises(ff.GradientCheckError, f"Linear({out}): backward's dx has shape "
                f"({batch}, {inp - 1}) but x has ({batch}, {inp})", "Fix:"):
        ff.check_grads(layer, p, randn(batch, inp))


def test_check_grads_gradient_of_another_dtype():
    out, inp = two_sizes()
    layer = Linear(out, "float32_dw")
    _, p = layer.init(key(), (inp,))
    with raises(ff.GradientCheckError, f"Linear({out}): backward's grads['w'] has dtype float32 "
                "but params['w'] is float64 (check_grads runs in float64)",
                "Fix: compute in the dtype of the inputs"):
        ff.check_grads(layer, p, randn(size(), inp))


def test_check_grads_in_inference_says_why_a_layer_without_residuals_fails():
    """The guide lets forward(train=False) save no residuals; check_grads(train=False) of
    such a layer (Swish, the guide's own) says so instead of a bare KeyError."""

    class Swish(nn.Layer):
        def init(self, key, in_shape):
            return tuple(in_shape), {}

        def forward(self, params, x, *, key=None, train=True):
            s = 1 / (1 + np.exp(-x))
            return x * s, ({"x": x, "s": s} if train else {})

        def backward(self, params, residuals, dy):
            x, s = residuals["x"], residuals["s"]
            return {}, dy * (s + x * s * (1 - s))

    inp = size()
    assert ff.check_grads(Swish(), {}, randn(3, inp)).checked > 0
    with raises(ff.GradientCheckError, "backward failed on the residuals of forward(..., "
                "train=False) (KeyError: 'x')", "Fix: check_grads(..., train=True)"):
        ff.check_grads(Swish(), {}, randn(3, inp), train=False)


@pytest.mark.parametrize("make", [lambda: nn.Dense(4, "relu"), lambda: nn.GELU(),
                                  lambda: nn.Serial(nn.Dense(4, "relu"), nn.Dense(3))],
                         ids=["dense_relu", "gelu", "serial"])
def test_check_grads_in_inference_of_a_layer_that_checks_its_residuals(make):
    """A backward that checks its residuals raises LayerError (self.error) on those of
    forward(train=False): check_grads says why, as for the KeyError of one that does not."""
    layer = make()
    _, params = layer.init(ff.random.key(0), (5,))
    with raises(ff.GradientCheckError, "backward failed on the residuals of forward(..., "
                "train=False) (LayerError: ", "Fix: check_grads(..., train=True)"):
        ff.check_grads(layer, params, randn(3, 5), train=False)


def test_check_grads_names_a_nested_leaf():
    """In a Serial the leaf is named by its whole path; a right backward still passes."""
    out, inp = two_sizes()
    model = nn.Serial(nn.Dense(inp, "relu"), Linear(out, "keepdims_db"))
    _, p = model.init(key(), (inp,))
    p = ff.tree.map(lambda a: a + randn(*a.shape), p)  # random biases: no ReLU kinks
    with raises(ff.GradientCheckError, "Serial(Dense(", "backward's grads[1]['b'] has shape "
                f"(1, {out}) but params[1]['b'] has ({out},)"):
        ff.check_grads(model, p, randn(size(), inp))
    # A right backward passes. Small sizes, as in test_layers' finite-difference checks, a
    # smooth activation, and the initializer's weights with small random shifts: the float64
    # rounding of a central difference grows with the objective (|f| * 1e-16 / eps), and
    # with weights shifted by whole standard normals the objective reached ~100, whose
    # rounding (1e-8) exceeded the tolerance on tiny gradients (about 1 run in 50; ReLU
    # kinks within eps of 0 and 40-wide layers had made it 1 in 10 before).
    good = nn.Serial(nn.Dense(11, "gelu"), Linear(5))
    _, gp = good.init(key(), (11,))
    gp = ff.tree.map(lambda a: a + 0.1 * randn(*a.shape), gp)
    assert ff.check_grads(good, gp, randn(5, 11)).max_error <= 1.0


# ---- 2. Serial blames the generic layer whose shapes disagree, not its Dense neighbour -------
@pytest.mark.parametrize("below", ["dense", "dense_relu", "dense_then_relu_layer"])
def test_serial_blames_a_layer_whose_dx_has_the_wrong_shape(below):
    hidden, out, batch, inp = size(4), size(), size(), size()
    first = {"dense": [nn.Dense(hidden)], "dense_relu": [nn.Dense(hidden, "relu")],
             "dense_then_relu_layer": [nn.Dense(hidden), nn.ReLU()]}[below]
    model = nn.Serial(*first, Linear(out, "narrow_dx"), nn.Dense(3))
    pos = len(first)
    _, p = model.init(key(), (inp,))
    x = randn(batch, inp)
    y, res = model.forward(p, x)
    want = (f"Serial layer {pos} (Linear({out})): backward returned dx of shape "
            f"({batch}, {hidden - 1}) but its input had shape ({batch}, {hidden})",
            "Fix: return dx with the shape of forward's input x")
    with raises(LayerError, *want):
        model.backward(p, res, randn(*y.shape))
    loss = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    with raises(LayerError, *want):  # the path that releases residuals as it goes
        loss(p, x, rng.integers(0, 3, batch))


def test_serial_blames_a_layer_whose_output_is_not_what_its_init_declared():
    hidden, out, batch, inp = size(), size(), size(), size()
    model = nn.Serial(nn.Dense(hidden, "relu"), Linear(out, "declares_wider"), nn.Dense(3))
    _, p = model.init(key(), (inp,))
    with raises(LayerError, f"Serial layer 1 (Linear({out})): forward returned shape "
                f"({batch}, {out}) but init declared (batch, {out + 1}). Fix: make init return "
                "the output shape forward produces."):
        model.forward(p, randn(batch, inp))


def test_a_wrong_dy_gets_a_fix_for_dy_not_for_inputs():
    hidden, batch, inp = size(), size(), size()
    model = nn.Serial(nn.Dense(hidden, "relu"), nn.Dense(10))
    _, p = model.init(key(), (inp,))
    _, res = model.forward(p, randn(batch, inp))
    with raises(LayerError, f"Serial layer 1 (Dense(10)): expected dy of shape (batch, 10), got "
                f"({batch}, 11). Fix: pass dy shaped like this layer's output, (batch, 10): the "
                "gradient of the loss with respect to that output."):
        model.backward(p, res, randn(batch, 11))


def test_serial_blames_a_layer_whose_backward_breaks_the_contract():
    """Grads missing a param, or a dx of another dtype than the Dense below computes in:
    named with the layer and its position here, not later in the optimizer or that Dense."""
    hidden, out, batch, inp = size(), size(), size(), size()
    for bad, says in (("no_db", "backward returned grads of structure"),
                      ("float64_dx", "backward returned dx of dtype float64, but the Dense "
                                     "below computes in float32")):
        model = nn.Serial(nn.Dense(hidden, "relu"), Linear(out, bad), nn.Dense(3))
        _, p = model.init(key(), (inp,))
        with raises(LayerError, f"Serial layer 1 (Linear({out})): {says}", "Fix:"):
            ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(
                p, randn(batch, inp), rng.integers(0, 3, batch))

    class Casting(nn.Dense):  # its own backward_fused takes any dy dtype: not checked
        def backward_fused(self, params, residuals, dy, **kw):
            return super().backward_fused(params, residuals, dy.astype(params["w"].dtype), **kw)

    model = nn.Serial(Casting(hidden, "relu"), Linear(out, "float64_dx"), nn.Dense(3))
    _, p = model.init(key(), (inp,))
    ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        p, randn(batch, inp), rng.integers(0, 3, batch))


def test_serial_blames_a_layer_whose_output_changed_the_dtype():
    """A float64 output of a layer fed float32 would fail in the Dense above with a fix for
    x, which the user never passed: the message names the layer that changed the dtype."""
    hidden, out, batch, inp = size(), size(), size(), size()
    model = nn.Serial(nn.Dense(hidden, "relu"), Linear(out, "float64_y"), nn.Dense(3))
    _, p = model.init(key(), (inp,))
    with raises(LayerError, f"Serial layer 1 (Linear({out})): forward returned dtype float64 "
                "(from an input of float32), but the Dense above computes in float32 (its "
                "params)", "Fix: return y in float32, y.astype(np.float32); or, if the cast is "
                "intended, give that Dense param_dtype=np.float64."):
        model.forward(p, randn(batch, inp))

    class CastingDense(nn.Dense):  # a subclass with its own forward may take other dtypes
        def forward(self, params, x, **kw):
            return super().forward(params, x.astype(params["w"].dtype), **kw)

    model = nn.Serial(nn.Dense(hidden, "relu"), Linear(out, "float64_y"), CastingDense(3))
    _, p = model.init(key(), (inp,))
    assert model.forward(p, randn(batch, inp))[0].dtype == np.float32
    # a layer that kept a wrong input's dtype is not blamed: the Dense names the input's
    model = nn.Serial(Linear(out), nn.Dense(3))
    _, p = model.init(key(), (inp,))
    with raises(LayerError, "Serial layer 1 (Dense(3)): expected input of dtype float32, got "
                "float64"):
        model.forward(p, randn(batch, inp, dtype=np.float64))


def test_serial_first_layer_output_names_its_input_too():
    """Layer 0's input is the model's: it may be the input that is wrong, so both are said."""
    out, batch, inp = size(), size(), size()
    model = nn.Serial(Linear(out, "declares_wider"), nn.Dense(3))
    _, p = model.init(key(), (inp,))
    with raises(LayerError, f"Serial layer 0 (Linear({out})): forward returned shape ({batch}, "
                f"{out}) for an input of shape ({batch}, {inp}), but init declared (batch, "
                f"{out + 1}). Fix: pass a batch of the in_shape given to init, or make init"):
        model.forward(p, randn(batch, inp))
    a, b, batch = size(), size(), size()
    model = nn.Serial(nn.Flatten(), nn.Dense(size()))
    _, p = model.init(key(), (a, b))
    with raises(LayerError, f"Serial layer 0 (Flatten()): forward returned shape ({batch}, "
                f"{(a + 1) * b}) for an input of shape ({batch}, {a + 1}, {b}), but init declared "
                f"(batch, {a * b}). Fix: pass a batch of the in_shape given to init"):
        model.forward(p, randn(batch, a + 1, b))


def test_serial_with_right_custom_layers_between_fused_dense_stages_still_trains():
    inp, hidden, batch = size(), size(), size()
    model = nn.Serial(nn.Dense(hidden, "relu"), Linear(hidden), nn.Dense(hidden, "gelu"),
                      nn.Dense(hidden), nn.ReLU(), nn.Dense(4))
    _, p = model.init(key(), (inp,))
    loss, grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        p, randn(batch, inp), rng.integers(0, 4, batch))
    assert np.isfinite(float(loss))
    assert ff.tree.structure(grads) == ff.tree.structure(p)


# ---- 3. Dense checks what its initializers return, and that they were called -----------------
def test_dense_init_checks_the_weight_initializers_shape():
    f, inp = two_sizes()
    layer = nn.Dense(f, w_init=lambda k, s, d: randn(s[1], s[0], dtype=d))
    with raises(LayerError, f"Dense({f}): w_init returned shape ({inp}, {f}), expected ({f}, "
                f"{inp}) = (out, in). Fix: w_init is called as init(key, shape, dtype)"):
        layer.init(key(), (inp,))


def test_dense_init_checks_the_bias_initializers_shape():
    f, inp = size(), size()
    layer = nn.Dense(f, b_init=lambda k, s, d: randn(1, *s, dtype=d))
    with raises(LayerError, f"Dense({f}): b_init returned shape (1, {f}), expected ({f},). Fix:"):
        layer.init(key(), (inp,))


@pytest.mark.parametrize("param_dtype", [np.float32, np.float16])
def test_dense_init_checks_the_initializers_dtype(param_dtype):
    f, inp = size(), size()
    layer = nn.Dense(f, w_init=lambda k, s, d: rng.standard_normal(s), param_dtype=param_dtype)
    with raises(LayerError, f"Dense({f}): w_init returned dtype float64, expected "
                f"{np.dtype(param_dtype)} (param_dtype). Fix:", "a.astype(dtype)"):
        layer.init(key(), (inp,))


def test_dense_init_checks_the_initializer_returns_an_array():
    f, inp = size(), size()
    layer = nn.Dense(f, b_init=lambda k, s, d: randn(*s).tolist())
    with raises(LayerError, f"Dense({f}): b_init's result must be an array (NumPy or CuPy), got "
                "list. Fix:"):
        layer.init(key(), (inp,))


@pytest.mark.parametrize("factory,call", [
    ("glorot_uniform", "glorot_uniform()"), ("he_normal", "he_normal()"),
    ("lecun_normal", "lecun_normal()"), ("normal", "normal()"), ("constant", "constant(value)"),
    ("variance_scaling", "variance_scaling(scale)")])
@pytest.mark.parametrize("arg", ["w_init", "b_init"])
def test_dense_an_initializer_factory_passed_uncalled(factory, call, arg):
    with raises(LayerError, f"Dense: {arg} is the initializer factory {factory}, not an "
                f"initializer. Fix: pass nn.initializers.{call}, not {factory}"):
        nn.Dense(size(), **{arg: getattr(nn.initializers, factory)})


def test_dense_an_initializer_of_another_signature_or_type():
    with raises(LayerError, "Dense: w_init <lambda>(k, s) cannot be called as init(key, shape, "
                "dtype). Fix:"):
        nn.Dense(size(), w_init=lambda k, s: randn(*s))
    with raises(LayerError, "Dense: w_init must be an initializer init(key, shape, dtype), got "
                "'glorot_uniform'. Fix:"):
        nn.Dense(size(), w_init="glorot_uniform")


def test_dense_right_initializers_still_build():
    f, inp = size(), size()
    layer = nn.Dense(f, w_init=nn.initializers.glorot_uniform(), b_init=nn.initializers.zeros,
                     param_dtype=np.float64)
    _, p = layer.init(key(), (inp,))
    assert p["w"].shape == (f, inp) and p["w"].dtype == p["b"].dtype == np.float64


# ---- 4. Serial rejects a layer class that was never instantiated ----------------------------
@pytest.mark.parametrize("cls", [nn.ReLU, nn.Flatten, nn.Dense, Linear])
def test_serial_a_layer_class_instead_of_a_layer(cls):
    name = cls.__name__
    with raises(TypeError, f"Serial: argument 1 is the class {name}, not a layer. Fix: pass "
                f"{name}() (call it)"):
        nn.Serial(nn.Dense(10), cls)
    with raises(TypeError, f"Serial: argument 0 is the class {name}"):
        nn.Serial([cls, nn.Dense(10)])


# ---- 5. an int in_shape is a width ------------------------------------------------------------
def test_serial_init_takes_an_int_in_shape():
    inp, k = size(), key()
    model = nn.Serial(nn.Dense(size(), "relu"), nn.Dropout(0.2), nn.Dense(3))
    out_int, p_int = model.init(k, inp)
    out_tuple, p_tuple = model.init(k, (inp,))
    assert out_int == out_tuple == (3,)
    for a, b in zip(ff.tree.leaves(p_int), ff.tree.leaves(p_tuple)):
        np.testing.assert_array_equal(a, b)
    assert model.init(k, np.int64(inp))[0] == (3,)


@pytest.mark.parametrize("layer", [nn.ReLU(), nn.GELU(), nn.Dropout(0.1), nn.Flatten(),
                                   nn.Serial(nn.Flatten(), nn.ReLU())], ids=repr)
def test_shape_free_layers_take_an_int_in_shape(layer):
    inp = size()
    assert layer.init(key(), inp)[0] == (inp,)


@pytest.mark.parametrize("in_shape", [None, 7.0, "784"])
def test_an_in_shape_that_is_neither_an_int_nor_a_tuple(in_shape):
    with raises(LayerError, f"Serial(ReLU()): in_shape must be a tuple such as (784,), got "
                f"{in_shape!r}. Fix: give init the input's shape without the batch axis"):
        nn.Serial(nn.ReLU()).init(key(), in_shape)


def test_check_grads_in_inference_keeps_a_real_backward_error():
    """A layer that saves the same residuals in both modes and has a bug in backward: the
    bug's own error, not the inference-residuals explanation."""

    class Buggy(nn.Layer):
        def init(self, key, in_shape):
            return tuple(in_shape), {}

        def forward(self, params, x, *, key=None, train=True):
            return x * 2, {"x": x}

        def backward(self, params, residuals, dy):
            return {}, residuals["y"]  # a typo: forward saved "x"

    with pytest.raises(KeyError, match="'y'"):
        ff.check_grads(Buggy(), {}, randn(3, size()), train=False)


@pytest.mark.parametrize("bad, says", [(np.zeros((), np.int32), "params['step'] is int32"),
                                       (1.5, "params['step'] is a float")])
def test_check_grads_names_a_param_that_is_not_a_float_array(bad, says):
    out, inp = two_sizes()
    layer = Linear(out)
    _, p = layer.init(key(), (inp,))
    with raises(ff.GradientCheckError, f"Linear({out}): {says}: every param is trained",
                "Fix: make it a float array"):
        ff.check_grads(layer, {**p, "step": bad}, randn(3, inp))


class FrozenBias(nn.Dense):
    """A Dense whose bias is not trained: its backward (the layer contract) zeroes db."""

    def backward(self, params, residuals, dy, *, need_input_grad=True):
        grads, dx = super().backward(params, residuals, dy, need_input_grad=need_input_grad)
        return {"w": grads["w"], "b": grads["b"] * 0}, dx


class Doubled(nn.Dense):
    """A Dense with the contract's forward signature (no ``activation=``): y doubled."""

    def forward(self, params, x, *, key=None, train=True):
        y, residuals = super().forward(params, x, key=key, train=train)
        return 2 * y, residuals

    def backward(self, params, residuals, dy, *, need_input_grad=True):
        return super().backward(params, residuals, 2 * dy, need_input_grad=need_input_grad)


@pytest.mark.parametrize("where", ["top", "bottom"])
def test_serial_runs_a_dense_subclass_own_backward(where):
    """Serial's fusion engine drives Dense through backward_fused; a subclass that overrides
    backward (and not backward_fused) is a stage of its own, so its backward is the one run."""
    hidden, batch, inp = size(), size(), size()
    model = (nn.Serial(nn.Dense(hidden, "relu"), FrozenBias(3)) if where == "top" else
             nn.Serial(FrozenBias(hidden, "relu"), nn.Dense(3)))
    i = 1 if where == "top" else 0
    assert model.stages[i].dense is None and repr(model.layers[i]).startswith("FrozenBias(")
    _, p = model.init(key(), (inp,))
    x, labels = randn(batch, inp), rng.integers(0, 3, batch)
    for loss, y in ((ff.losses.softmax_cross_entropy, labels),
                    (ff.losses.mse, randn(batch, 3))):
        _, grads = ff.value_and_grad(model, loss)(p, x, y)
        assert not np.any(grads[i]["b"]) and np.any(grads[i]["w"])
    out, residuals = model.forward(p, x)
    grads, _ = model.backward(p, residuals, randn(*out.shape))
    assert not np.any(grads[i]["b"])


def test_serial_runs_a_dense_subclass_with_the_contracts_forward():
    """Its forward gets the contract's keywords only, its backward runs, and the model's
    gradients agree with finite differences (float64)."""
    hidden, batch, inp = size(), size(), size()
    model = nn.Serial(nn.Dense(hidden, "relu"), Doubled(3), nn.ReLU(), nn.Dense(2))
    _, p = model.init(key(), (inp,))
    p = ff.tree.map(lambda a: a.astype(np.float64) + 0.1, p)
    x = randn(batch, inp, dtype=np.float64)
    ff.check_grads(model, p, x)
    y, _ = model.forward(p, x)
    h = np.maximum(x @ p[0]["w"].T + p[0]["b"], 0)
    h = np.maximum(2 * (h @ p[1]["w"].T + p[1]["b"]), 0)
    np.testing.assert_allclose(y, h @ p[3]["w"].T + p[3]["b"], rtol=1e-12)


def test_a_custom_loss_gradient_of_another_dtype_names_the_loss():
    """Float64 targets in a float32 model widen a hand-written loss's gradient: the loss is
    named, not the output Dense's dy (which the user never passed)."""
    def mae(outputs, targets):
        diff = outputs - targets
        return abs(diff).mean(), np.sign(diff) / diff.size

    model = nn.Serial(nn.Dense(size(), "relu"), nn.Dense(2))
    batch, inp = size(), size()
    _, p = model.init(key(), (inp,))
    f = ff.value_and_grad(model, mae)
    with raises(TypeError, "the loss mae returned a gradient of dtype float64 for outputs of "
                "dtype float32", "Fix: compute the loss on targets of the outputs' dtype"):
        f(p, randn(batch, inp), randn(batch, 2, dtype=np.float64))
    loss, _ = f(p, randn(batch, inp), randn(batch, 2))
    assert np.isfinite(loss)
