"""Layers and the dense ops, forward and backward, on fresh random inputs (``rng``).

Checked against (a) central finite differences in float64 (``ref.layer_fd_check``, not
``ff.check_grads``) and (b) the independent float64 NumPy references of tests/reference.py,
written from the definitions: Dense, ReLU, GELU, LayerNorm, Flatten, Dropout, Serial
architectures the rest of the suite does not differentiate, and ``ops.dense_forward``,
``dense_backward`` and ``dense_softmax_xent`` called directly. Edge cases: batch 1, odd
widths (relu_aux bit packing), exact zeros at the ReLU boundary, non-contiguous inputs,
float32/float16, every integer label dtype.
"""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import backend, losses, nn
from fuseflow.backend.epilogs import relu_aux_rows
from fuseflow.ops import dense_backward, dense_forward, dense_softmax_xent
from tests import reference as ref

ODD = [1, 3, 17, 33]


def new_key(rng):
    return ff.random.key(int(rng.integers(1 << 30)))


def dense_params(rng, inp, out, use_bias=True):
    p = {"w": rng.standard_normal((out, inp))}
    if use_bias:
        p["b"] = rng.standard_normal(out)
    return p


# ---- Dense -------------------------------------------------------------------------------
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("inp,out", [(1, 1), (3, 17), (17, 3), (33, 33)])
def test_dense_vs_reference_and_fd(rng, act, use_bias, batch, inp, out):
    layer = nn.Dense(out, act, use_bias=use_bias)
    p = dense_params(rng, inp, out, use_bias)
    while True:  # finite differences need every pre-activation away from the ReLU kink
        x = rng.standard_normal((batch, inp))
        if act != "relu" or np.abs(x @ p["w"].T + p.get("b", 0)).min() > 1e-3:
            break
    y, res, dy, grads, dx = ref.layer_fd_check(layer, p, x, rng)
    y_ref, grad_ref = ref.mlp([p], x, [act])
    ref.close(y, y_ref, 1e-12, 1e-12, "y", rng.seed)
    (g_ref,), dx_ref = grad_ref(dy)
    ref.tree_close(grads, g_ref, 1e-12, 1e-12, "grads", rng.seed)
    ref.close(dx, dx_ref, 1e-12, 1e-12, "dx", rng.seed)
    g2, dx2 = layer.backward(p, res, dy, need_input_grad=False)
    assert dx2 is None
    ref.tree_close(g2, grads, 0, 0, "grads without dx", rng.seed)


@pytest.mark.parametrize("width", ODD)
def test_dense_relu_at_exact_zero_passes_gradient_odd_widths(rng, width):
    """Zero input and zero bias: every pre-activation is exactly 0; >= 0 lets dy through."""
    layer = nn.Dense(width, "relu")
    p = {"w": rng.standard_normal((width, 5)), "b": np.zeros(width)}
    y, res = layer.forward(p, np.zeros((1, 5)))
    dy = rng.standard_normal((1, width))
    grads, dx = layer.backward(p, res, dy)
    np.testing.assert_array_equal(y, 0)
    np.testing.assert_array_equal(grads["b"], dy[0])
    ref.close(dx, dy @ p["w"], 1e-13, 1e-13, "dx", rng.seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_dense_low_precision_vs_float64(rng, dtype, act):
    """Against the float64 formulas on the same (rounded) operands. Under ReLU the mask is
    the layer's own relu_aux: rounding may flip the sign of a near-zero pre-activation."""
    batch, inp, out = 5, 33, 17
    p = {k: v.astype(dtype) for k, v in dense_params(rng, inp, out).items()}
    x = rng.standard_normal((batch, inp)).astype(dtype)
    dy = rng.standard_normal((batch, out)).astype(dtype)
    layer = nn.Dense(out, act, param_dtype=dtype)
    y, res = layer.forward(p, x)
    grads, dx = layer.backward(p, res, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    assert all(g.dtype == dtype for g in grads.values())
    x64, dy64, w64 = x.astype(np.float64), dy.astype(np.float64), p["w"].astype(np.float64)
    pre = x64 @ w64.T + p["b"].astype(np.float64)
    if act == "relu":
        dact = ref.relu_aux_bits(res["relu_aux"], out, batch)
    else:
        dact = ref.ACT[act][1](pre)
    dpre = dy64 * dact
    tol = 1e-5 if dtype == np.float32 else 1e-2
    ref.close(y, ref.ACT[act][0](pre), tol, tol * 10, "y", rng.seed)  # a flipped sign: |y| ~ 0
    for name, got, want in [("w", grads["w"], dpre.T @ x64), ("b", grads["b"], dpre.sum(0)),
                            ("dx", dx, dpre @ w64)]:
        ref.close(got, want, tol, tol * np.abs(want).max(), name, rng.seed)


def test_dense_non_contiguous_inputs_give_the_same_result(rng):
    layer = nn.Dense(9, "relu")
    _, p = layer.init(new_key(rng), (7,))
    xt = rng.standard_normal((7, 4)).astype(np.float32).T           # transposed view
    xs = rng.standard_normal((8, 14)).astype(np.float32)[::2, ::2]  # strided slice
    for x in (xt, xs):
        assert not x.flags.c_contiguous
        y, res = layer.forward(p, x)
        yc, resc = layer.forward(p, np.ascontiguousarray(x))
        np.testing.assert_array_equal(y, yc)
        dy = rng.standard_normal((9, len(x))).astype(np.float32).T   # non-contiguous dy
        got = layer.backward(p, res, dy)
        want = layer.backward(p, resc, np.ascontiguousarray(dy))
        ref.tree_close(got, want, 1e-6, 1e-6, "(grads, dx)", rng.seed)


# ---- standalone ReLU / GELU --------------------------------------------------------------
ACTIVATIONS = pytest.mark.parametrize("cls", [nn.ReLU, nn.GELU], ids=lambda c: c.__name__)


@ACTIVATIONS
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("width", ODD + [8, 16, 129])
def test_activation_vs_reference_and_fd(rng, cls, batch, width):
    f, df = ref.ACT[cls.activation]
    x = ref.away_from_zero(rng, (batch, width))
    y, res, dy, _, dx = ref.layer_fd_check(cls(), {}, x, rng)
    ref.close(y, f(x), 1e-13, 1e-13, "y", rng.seed)
    ref.close(dx, dy * df(x), 1e-13, 1e-13, "dx", rng.seed)
    if cls.activation == "relu":
        aux = res["relu_aux"]
        assert aux.shape == (relu_aux_rows(width), batch) and aux.dtype == np.uint8


@pytest.mark.parametrize("width", ODD)
def test_relu_layer_exact_zeros_and_signed_zero(rng, width):
    x = rng.standard_normal((2, width))
    x[0, ::2] = 0.0
    x[1, ::3] = -0.0
    y, res = nn.ReLU().forward({}, x)
    dy = rng.standard_normal(x.shape)
    _, dx = nn.ReLU().backward({}, res, dy)
    np.testing.assert_array_equal(y, np.where(x >= 0, x, 0.0))
    np.testing.assert_array_equal(dx, np.where(x >= 0, dy, 0.0))  # +0 and -0 pass


@ACTIVATIONS
def test_activation_multi_dim_and_non_contiguous(rng, cls):
    f, df = ref.ACT[cls.activation]
    x = ref.away_from_zero(rng, (3, 5, 4)).transpose(0, 2, 1)  # (3, 4, 5), non-contiguous
    y, res, dy, _, dx = ref.layer_fd_check(cls(), {}, x, rng)
    ref.close(y, f(x), 1e-13, 1e-13, "y", rng.seed)
    ref.close(dx, dy * df(x), 1e-13, 1e-13, "dx", rng.seed)
    _, dx_f = cls().backward({}, res, np.asfortranarray(dy))
    np.testing.assert_array_equal(dx_f, dx)


@ACTIVATIONS
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_activation_low_precision_vs_float64(rng, cls, dtype):
    f, df = ref.ACT[cls.activation]
    x = ref.away_from_zero(rng, (4, 17)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y, res = cls().forward({}, x)
    _, dx = cls().backward({}, res, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    x64 = x.astype(np.float64)
    tol = 2e-3 if dtype == np.float16 else 5e-6
    ref.close(y, f(x64), tol, tol, "y", rng.seed)
    ref.close(dx, dy.astype(np.float64) * df(x64), tol, tol, "dx", rng.seed)


# ---- LayerNorm ---------------------------------------------------------------------------
@pytest.mark.parametrize("use_scale,use_bias", [(True, True), (False, True), (True, False),
                                                (False, False)])
@pytest.mark.parametrize("batch,width", [(1, 1), (1, 3), (4, 17), (2, 33)])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_layernorm_vs_reference_and_fd(rng, use_scale, use_bias, batch, width, eps):
    layer = nn.LayerNorm(eps=eps, use_scale=use_scale, use_bias=use_bias,
                         param_dtype=np.float64)
    _, p = layer.init(new_key(rng), (width,))
    p = {k: v + 0.5 * rng.standard_normal(v.shape) for k, v in p.items()}
    x = rng.standard_normal((batch, width)) * 2 + rng.standard_normal((batch, 1))
    y, _, dy, grads, dx = ref.layer_fd_check(layer, p, x, rng, atol=1e-6)
    y_ref, grad_ref = ref.layernorm(x, p.get("scale"), p.get("bias"), eps)
    ref.close(y, y_ref, 1e-12, 1e-12, "y", rng.seed)
    g_ref, dx_ref = grad_ref(dy)
    ref.close(dx, dx_ref, 1e-10, 1e-10, "dx", rng.seed)
    assert grads.keys() == p.keys()
    for k in grads:
        ref.close(grads[k], g_ref[k], 1e-12, 1e-12, k, rng.seed)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_layernorm_low_precision_vs_float64(rng, dtype):
    """float16/float32 activations with the default float32 scale and bias."""
    layer = nn.LayerNorm()
    _, p = layer.init(new_key(rng), (17,))
    p = {k: (v + 0.5 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in p.items()}
    x = rng.standard_normal((5, 17)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y, res = layer.forward(p, x)
    grads, dx = layer.backward(p, res, dy)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    y_ref, grad_ref = ref.layernorm(x.astype(np.float64), p64["scale"], p64["bias"], 1e-5)
    g_ref, dx_ref = grad_ref(dy.astype(np.float64))
    tol = 1e-2 if dtype == np.float16 else 1e-5
    ref.close(y, y_ref, tol, tol, "y", rng.seed)
    ref.close(dx, dx_ref, tol, tol, "dx", rng.seed)
    for k in grads:
        assert grads[k].dtype == np.float32
        ref.close(grads[k], g_ref[k], tol, tol, k, rng.seed)


# ---- Flatten -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (1, 3, 1), (2, 3, 4), (2, 1, 3, 5)])
def test_flatten_fd_and_reference_multi_dim(rng, shape):
    x = rng.standard_normal(shape)
    y, _, dy, _, dx = ref.layer_fd_check(nn.Flatten(), {}, x, rng)
    np.testing.assert_array_equal(y, x.reshape(shape[0], -1))
    np.testing.assert_array_equal(dx, dy.reshape(shape))
    xt = rng.standard_normal(shape[::-1]).T  # non-contiguous
    yt, _ = nn.Flatten().forward({}, xt)
    np.testing.assert_array_equal(yt, np.ascontiguousarray(xt).reshape(xt.shape[0], -1))


# ---- Dropout -----------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.0, 0.2, 0.7])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_dropout_vs_reference_and_fd(rng, rate, dtype):
    """Element i is kept when the key's random bits at i are below keep_threshold(rate)."""
    key = new_key(rng)
    x = rng.standard_normal((3, 17)).astype(dtype)
    layer = nn.Dropout(rate)
    y, res = layer.forward({}, x, key=key)
    bits = ff.random.bits(key, x.shape).astype(np.uint64)
    keep = bits < np.uint64(ff.random.keep_threshold(rate))
    scale = np.where(keep, 1 / (1 - rate), 0.0) if rate else np.ones(x.shape)
    tol = 1e-3 if dtype == np.float16 else 1e-6
    ref.close(y, x.astype(np.float64) * scale, tol, tol, "y", rng.seed)
    dy = rng.standard_normal(x.shape).astype(dtype)
    _, dx = layer.backward({}, res, dy)
    assert dx.dtype == dtype
    ref.close(dx, dy.astype(np.float64) * scale, tol, tol, "dx", rng.seed)
    if dtype == np.float64:
        ref.layer_fd_check(layer, {}, x, rng, key=key)


# ---- Serial: architectures the rest of the suite does not differentiate ------------------
SERIALS = {
    "dense_nobias_gelu_absorbed": lambda: nn.Serial(nn.Dense(5, use_bias=False), nn.GELU(),
                                                    nn.Dense(3)),
    "dense_nobias_relu_absorbed": lambda: nn.Serial(nn.Dense(17, use_bias=False), nn.ReLU(),
                                                    nn.Dense(1, use_bias=False)),
    "relu_after_relu_dense": lambda: nn.Serial(nn.Dense(6, "relu"), nn.ReLU(), nn.Dense(3)),
    "gelu_after_layernorm": lambda: nn.Serial(nn.Dense(7), nn.LayerNorm(param_dtype=np.float64),
                                              nn.GELU(), nn.Dense(2)),
    "flatten_first": lambda: nn.Serial(nn.Flatten(), nn.Dense(4, "gelu"), nn.Dense(3, "relu"),
                                       nn.Dense(2)),
    "nested": lambda: nn.Serial(nn.Serial(nn.Dense(6, "relu"), nn.Dense(5, "gelu")),
                                nn.Dense(3)),
    "activation_first": lambda: nn.Serial(nn.GELU(), nn.Dense(4, "relu"), nn.Dense(3)),
    "dropout_between_fused": lambda: nn.Serial(nn.Dense(9, "gelu"), nn.Dropout(0.25),
                                               nn.Dense(4, "relu"), nn.Dense(2)),
}
# The Dense layers of those that are an MLP, in order, as ref.mlp's activations; the
# activation layers are absorbed into the Dense before them (relu(relu(z)) == relu(z)).
MLP_ACTIVATIONS = {"dense_nobias_gelu_absorbed": ["gelu", None],
                   "dense_nobias_relu_absorbed": ["relu", None],
                   "relu_after_relu_dense": ["relu", None],
                   "nested": ["relu", "gelu", None]}


SERIAL_KEY = 5  # the key test_serial_architectures_fd runs the models with (Dropout's mask)


def relu_margin(model, params, x, key):
    """The smallest |pre-activation| at any ReLU kink of the Serial ``model`` on ``x``.

    Walks the layers as Serial does (the same per-layer keys, so Dropout draws the same
    mask); a ReLU layer's exact zeros (from a ReLU before it) are not kinks that a small
    change of x or the params can cross, so they are left out."""
    keys = backend.of(key).layer_keys(key, len(model.layers))
    margin, h = np.inf, x
    for layer, p, k in zip(model.layers, params, keys):
        if isinstance(layer, nn.Serial):
            margin = min(margin, relu_margin(layer, p, h, k))
        elif isinstance(layer, nn.Dense) and layer.activation == "relu":
            margin = min(margin, np.abs(h @ p["w"].T + p.get("b", 0)).min())
        elif isinstance(layer, nn.ReLU) and (h != 0).any():
            margin = min(margin, np.abs(h[h != 0]).min())
        h = layer.forward(p, h, key=k)[0]
    return margin


def serial_problem(name, rng, batch):
    """A model of SERIALS, float64 params shifted off the initializer's, and an input whose
    ReLU pre-activations are all >= 1e-3 from 0, so that central differences (eps 1e-6, of
    x or of a param) never straddle a kink (seed 1527932870 had one at 6.9e-8)."""
    model = SERIALS[name]()
    in_shape = (2, 3) if name == "flatten_first" else (3,)
    _, p = model.init(new_key(rng), in_shape)
    p = ff.tree.map(lambda a: a.astype(np.float64) + 0.3 * rng.standard_normal(a.shape), p)
    while True:
        x = rng.standard_normal((batch, *in_shape))
        if relu_margin(model, p, x, ff.random.key(SERIAL_KEY)) > 1e-3:
            return model, p, x


def dense_entries(name, tree):
    """The Dense entries of a Serial's params (or grads) tree, in order."""
    return [*tree[0], tree[1]] if name == "nested" else [q for q in tree if q]


@pytest.mark.parametrize("name", sorted(SERIALS))
@pytest.mark.parametrize("batch", [1, 4])
def test_serial_architectures_fd(rng, name, batch):
    model, p, x = serial_problem(name, rng, batch)
    ref.layer_fd_check(model, p, x, rng, key=ff.random.key(SERIAL_KEY), atol=1e-6)


@pytest.mark.parametrize("name", sorted(MLP_ACTIVATIONS))
def test_serial_architectures_vs_reference(rng, name):
    model, p, x = serial_problem(name, rng, 5)
    y_ref, grad_ref = ref.mlp(dense_entries(name, p), x, MLP_ACTIVATIONS[name])
    y, res = model.forward(p, x)
    ref.close(y, y_ref, 1e-12, 1e-12, "y", rng.seed)
    dy = rng.standard_normal(y.shape)
    grads, dx = model.backward(p, res, dy)
    g_ref, dx_ref = grad_ref(dy)
    ref.tree_close(dense_entries(name, grads), g_ref, 1e-11, 1e-11, "grads", rng.seed)
    ref.close(dx, dx_ref, 1e-11, 1e-11, "dx", rng.seed)


@pytest.mark.parametrize("loss_name", ["mse", "bce", "sce_unfused"])
@pytest.mark.parametrize("name", ["flatten_first", "nested", "gelu_after_layernorm"])
def test_value_and_grad_with_other_losses_matches_fd(rng, name, loss_name):
    model, p, x = serial_problem(name, rng, 3)
    out = model.forward(p, x)[0]
    if loss_name == "mse":
        loss_fn, y = losses.mse, rng.standard_normal(out.shape)
    elif loss_name == "bce":
        loss_fn, y = losses.sigmoid_binary_cross_entropy, rng.random(out.shape)
    else:  # a wrapper, so value_and_grad does not recognise (and fuse) the loss
        loss_fn = lambda o, t: losses.softmax_cross_entropy(o, t)
        y = rng.integers(0, out.shape[1], len(x)).astype(np.uint8)
    loss, grads = ff.value_and_grad(model, loss_fn)(p, x, y)
    obj = lambda q: float(loss_fn(model.forward(q, x)[0], y)[0])
    ref.close(loss, obj(p), 0, 1e-12, "loss", rng.seed)
    ref.tree_close(grads, ref.fd_params(obj, p), 1e-5, 1e-7, "grads", rng.seed)


# ---- ops ---------------------------------------------------------------------------------
@pytest.mark.parametrize("below", ["relu", "gelu"])
@pytest.mark.parametrize("has_bias", [True, False])
def test_dense_ops_with_input_activation_and_pre_grad(rng, below, has_bias):
    """dense_backward's cross-layer epilog (DRELU/DGELU[_BGRAD]) and pre_grad path, called
    directly, against the two-layer textbook composition."""
    x = rng.standard_normal((4, 3))
    p1, p2 = dense_params(rng, 3, 17, has_bias), dense_params(rng, 17, 5)
    h, r1 = dense_forward(p1, x, activation=below)
    y, r2 = dense_forward(p2, h)
    y_ref, grad_ref = ref.mlp([p1, p2], x, [below, None])
    ref.close(y, y_ref, 1e-12, 1e-12, "y", rng.seed)
    dy = rng.standard_normal(y.shape)
    (g1_ref, g2_ref), dx_ref = grad_ref(dy)
    g2, dpre1, db1 = dense_backward(p2, r2, dy, input_activation=below,
                                    input_aux=r1[f"{below}_aux"], input_has_bias=has_bias)
    pre1 = x @ p1["w"].T + p1.get("b", 0)
    ref.close(dpre1, (dy @ p2["w"]) * ref.ACT[below][1](pre1), 1e-12, 1e-12, "dpre1", rng.seed)
    ref.tree_close(g2, g2_ref, 1e-12, 1e-12, "layer 2 grads", rng.seed)
    if has_bias:
        ref.close(db1, g1_ref["b"], 1e-12, 1e-12, "layer 1 bias grad", rng.seed)
    else:
        assert db1 is None
    g1, dx, _ = dense_backward(p1, r1, None, activation=below, pre_grad=(dpre1, db1))
    ref.close(g1["w"], g1_ref["w"], 1e-12, 1e-12, "layer 1 weight grad", rng.seed)
    ref.close(dx, dx_ref, 1e-12, 1e-12, "dx", rng.seed)


@pytest.mark.parametrize("label_dtype", ref.LABEL_DTYPES)
@pytest.mark.parametrize("input_activation", [None, "relu", "gelu"])
def test_dense_softmax_xent_op_vs_reference(rng, label_dtype, input_activation):
    classes, batch = 7, 5
    x0 = rng.standard_normal((batch, 4))
    p0, p = dense_params(rng, 4, 9), dense_params(rng, 9, classes)
    h, r0 = dense_forward(p0, x0, activation=input_activation)
    labels = rng.integers(0, classes, batch).astype(label_dtype)
    aux = r0[f"{input_activation}_aux"] if input_activation else None
    loss, logits, grads, dx, db = dense_softmax_xent(
        p, {"x": h}, labels, input_activation=input_activation, input_aux=aux,
        input_has_bias=input_activation is not None)
    _, grad_ref = ref.mlp([p0, p], x0, [input_activation, None])
    z = h @ p["w"].T + p["b"]
    loss_ref, dz = ref.softmax_xent(z, labels)
    ref.close(logits, z, 1e-12, 1e-12, "logits", rng.seed)
    ref.close(loss, loss_ref, 1e-12, 1e-12, "loss", rng.seed)
    (g0_ref, g_ref), _ = grad_ref(dz)
    ref.tree_close(grads, g_ref, 1e-12, 1e-12, "head grads", rng.seed)
    # dx: the gradient at the head's input, through the activation below when it has one
    pre0 = x0 @ p0["w"].T + p0["b"]
    ref.close(dx, dz @ p["w"] * ref.ACT[input_activation][1](pre0), 1e-12, 1e-12, "dx", rng.seed)
    if input_activation:
        ref.close(db, g0_ref["b"], 1e-12, 1e-12, "bias grad below", rng.seed)
    # and the head's parameter gradients against finite differences of the loss
    obj = lambda q: float(losses.softmax_cross_entropy(h @ q["w"].T + q["b"], labels)[0])
    ref.tree_close(grads, ref.fd_params(obj, p), 1e-5, 1e-7, "head grads (fd)", rng.seed)
