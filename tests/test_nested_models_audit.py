"""Model composition: Serials nested in Serials, empty and one-layer Serials, a layer object
used twice. A nested model must compute exactly what the same layers flattened into one
Serial compute (bit for bit on NumPy), be checked by float64 finite differences, keep
its params' paths through a checkpoint, and name the nested layer's position in errors."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

KEY = ff.random.key(0)


def _randn(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _perturbed(params, dtype=np.float32):
    """Nonzero biases / norm scales, so that no pre-activation sits at a ReLU kink."""
    return ff.tree.map(lambda p: (p + 0.3 * _randn(p.size, *p.shape, dtype=p.dtype))
                       .astype(dtype), params)


# (nested model, the same layers flattened, flat params -> nested params, in_shape)
CASES = {
    "nested-start": (
        lambda: nn.Serial(nn.Serial(nn.Dense(9, "relu"), nn.Dense(7)), nn.GELU(), nn.Dense(3)),
        lambda: nn.Serial(nn.Dense(9, "relu"), nn.Dense(7), nn.GELU(), nn.Dense(3)),
        lambda p: ((p[0], p[1]), p[2], p[3]), (6,)),
    "nested-middle": (
        lambda: nn.Serial(nn.Dense(9, "relu"), nn.Serial(nn.Dense(7, "gelu"), nn.Dense(5)),
                          nn.Dense(3)),
        lambda: nn.Serial(nn.Dense(9, "relu"), nn.Dense(7, "gelu"), nn.Dense(5), nn.Dense(3)),
        lambda p: (p[0], (p[1], p[2]), p[3]), (6,)),
    "nested-end": (
        lambda: nn.Serial(nn.Dense(9), nn.ReLU(), nn.Serial(nn.Dense(7, "relu"), nn.Dense(3))),
        lambda: nn.Serial(nn.Dense(9), nn.ReLU(), nn.Dense(7, "relu"), nn.Dense(3)),
        lambda p: (p[0], p[1], (p[2], p[3])), (6,)),
    # the ReLU/GELU opening the nested Serial is not absorbed by the Dense before it
    "dense-then-nested-relu": (
        lambda: nn.Serial(nn.Dense(9), nn.Serial(nn.ReLU(), nn.Dense(7)), nn.Dense(3)),
        lambda: nn.Serial(nn.Dense(9), nn.ReLU(), nn.Dense(7), nn.Dense(3)),
        lambda p: (p[0], (p[1], p[2]), p[3]), (6,)),
    "dense-then-nested-gelu": (
        lambda: nn.Serial(nn.Dense(9), nn.Serial(nn.GELU(), nn.Dense(7, "relu")), nn.Dense(3)),
        lambda: nn.Serial(nn.Dense(9), nn.GELU(), nn.Dense(7, "relu"), nn.Dense(3)),
        lambda p: (p[0], (p[1], p[2]), p[3]), (6,)),
    "empty-and-single": (
        lambda: nn.Serial(nn.Dense(9, "relu"), nn.Serial(), nn.Serial(nn.Dense(4)),
                          nn.Serial(nn.Serial(nn.LayerNorm())), nn.Dense(3)),
        lambda: nn.Serial(nn.Dense(9, "relu"), nn.Dense(4), nn.LayerNorm(), nn.Dense(3)),
        lambda p: (p[0], (), (p[1],), ((p[2],),), p[3]), (6,)),
    "flatten-layernorm-dropout": (
        lambda: nn.Serial(nn.Serial(nn.Flatten(), nn.Dense(8, "relu")),
                          nn.Serial(nn.LayerNorm(), nn.Dropout(0.0)), nn.Dense(3)),
        lambda: nn.Serial(nn.Flatten(), nn.Dense(8, "relu"), nn.LayerNorm(), nn.Dropout(0.0),
                          nn.Dense(3)),
        lambda p: ((p[0], p[1]), (p[2], p[3]), p[4]), (2, 3)),
}


def _case(name, dtype=np.float32):
    make_nested, make_flat, nest, in_shape = CASES[name]
    nested, flat = make_nested(), make_flat()
    shape, pf = flat.init(KEY, in_shape)
    pf = _perturbed(pf, dtype)
    x = _randn(1, 5, *in_shape, dtype=dtype)
    return nested, flat, nest, pf, x, shape


@pytest.mark.parametrize("name", CASES)
def test_nested_is_bit_identical_to_flat(name):
    nested, flat, nest, pf, x, shape = _case(name)
    pn = nest(pf)
    assert nested.init(KEY, CASES[name][3])[0] == shape
    assert ff.tree.structure(nested.init(KEY, CASES[name][3])[1]) == ff.tree.structure(pn)
    for train in (False, True):
        np.testing.assert_array_equal(nested.forward(pn, x, train=train)[0],
                                      flat.forward(pf, x, train=train)[0])
    np.testing.assert_array_equal(nested.apply(pn, x), flat.apply(pf, x))
    yf, rf = flat.forward(pf, x)
    yn, rn = nested.forward(pn, x)
    dy = _randn(2, *yf.shape)
    gf, dxf = flat.backward(pf, rf, dy)
    gn, dxn = nested.backward(pn, rn, dy)
    np.testing.assert_array_equal(dxn, dxf)
    assert ff.tree.structure(gn) == ff.tree.structure(pn)
    for a, b in zip(ff.tree.leaves(gn), ff.tree.leaves(nest(gf)), strict=True):
        np.testing.assert_array_equal(a, b)
    # value_and_grad: a custom loss (separate steps) and the fused softmax head
    labels = np.arange(len(x)) % shape[0]
    for loss in (ff.losses.mse, ff.losses.softmax_cross_entropy):
        target = labels if loss is ff.losses.softmax_cross_entropy else np.zeros_like(yf)
        ln, gn = ff.value_and_grad(nested, loss)(pn, x, target)
        lf, gf = ff.value_and_grad(flat, loss)(pf, x, target)
        np.testing.assert_allclose(ln, lf, rtol=1e-6)
        for a, b in zip(ff.tree.leaves(gn), ff.tree.leaves(nest(gf)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_nested_matches_finite_differences(name):
    nested, _, nest, pf, x, _ = _case(name, np.float64)
    report = ff.check_grads(nested, nest(pf), x, key=ff.random.key(3), max_checks=16)
    assert report.checked > 0 and report.max_error <= 1.0


def test_nested_dropout_with_key_matches_finite_differences_and_is_reproducible():
    model = nn.Serial(nn.Dense(8, "relu"), nn.Serial(nn.Dropout(0.5), nn.Dense(6)),
                      nn.Serial(nn.Serial(nn.Dropout(0.3))), nn.Dense(2))
    assert model.draws_random
    _, params = model.init(KEY, 5)
    params = _perturbed(params, np.float64)
    x = _randn(4, 7, 5, dtype=np.float64)
    ff.check_grads(model, params, x, key=ff.random.key(9), max_checks=16)
    a = model.forward(params, x, key=ff.random.key(9))[0]
    np.testing.assert_array_equal(a, model.forward(params, x, key=ff.random.key(9))[0])
    assert not np.array_equal(a, model.forward(params, x, key=ff.random.key(10))[0])
    with pytest.raises(nn.LayerError, match=r"Serial layer 1 .*Serial layer 0 \(Dropout"):
        model.forward(params, x)  # training without a key names the nested Dropout
    # inference: the Dropouts are identities and no key is needed
    flat = nn.Serial(nn.Dense(8, "relu"), nn.Dense(6), nn.Dense(2))
    np.testing.assert_array_equal(model.apply(params, x),
                                  flat.apply((params[0], params[1][1], params[3]), x))


def test_draws_random_of_nested_containers():
    assert not nn.Serial().draws_random
    assert not nn.Serial(nn.Serial(nn.Dense(3)), nn.Serial()).draws_random
    assert nn.Serial(nn.Dense(3), nn.Serial(nn.Serial(nn.Dropout(0.1)))).draws_random


def test_fusion_does_not_cross_a_nested_boundary():
    """Dense -> Serial(ReLU, ...): the ReLU runs as its own kernel (the nested Serial is a
    stage of its own); inside the nested Serial, Dense(relu) -> Dense still fuses."""
    be = ff.backend.get("numpy")
    model = nn.Serial(nn.Dense(9), nn.Serial(nn.ReLU(), nn.Dense(7, "relu"), nn.Dense(4)))
    assert [st.dense is None for st in model.stages] == [False, True]
    _, params = model.init(KEY, 6)
    x = _randn(0, 5, 6)
    be.reset_stats()
    y, res = model.forward(params, x)
    assert dict(be.calls) == {"linear/BIAS": 2, "activation/relu": 1,
                              "linear/RELU_AUX_BIAS": 1}
    be.reset_stats()
    model.backward(params, res, np.ones_like(y), need_input_grad=False)
    assert dict(be.calls) == {"linear_wgrad/BGRADB": 2, "linear_dgrad/DRELU_BGRAD": 1,
                              "linear_wgrad/DEFAULT": 1, "linear_dgrad/DEFAULT": 1,
                              "activation_grad/relu": 1}


@pytest.mark.parametrize("loss", [ff.losses.mse, ff.losses.softmax_cross_entropy])
def test_nested_first_layer_computes_no_input_gradient(loss):
    """value_and_grad does not compute the first layer's input gradient; a nested Serial at
    the bottom must be told so (it used to run one dgrad matmul more than its flat twin)."""
    be = ff.backend.get("numpy")
    flat = nn.Serial(nn.Dense(8, "relu"), nn.Dense(6, "relu"), nn.Dense(3))
    nested = nn.Serial(nn.Serial(nn.Serial(nn.Dense(8, "relu")), nn.Dense(6, "relu")),
                       nn.Dense(3))
    _, pf = flat.init(KEY, 5)
    pn = (((pf[0],), pf[1]), pf[2])
    x, labels = _randn(0, 4, 5), np.array([0, 1, 2, 0])
    target = labels if loss is ff.losses.softmax_cross_entropy else np.zeros((4, 3), np.float32)
    counts = []
    for model, params in ((flat, pf), (nested, pn)):
        be.reset_stats()
        ff.value_and_grad(model, loss)(params, x, target)
        counts.append(sum(n for c, n in be.calls.items() if c.startswith("linear_dgrad/")))
    assert counts[0] == 2 and counts[1] == 2, counts
    y, res = nested.forward(pn, x)
    grads, dx = nested.backward(pn, res, np.ones_like(y), need_input_grad=False)
    assert dx is None and ff.tree.structure(grads) == ff.tree.structure(pn)
    _, dx = nested.backward(pn, res, np.ones_like(y))
    assert dx.shape == x.shape


def test_same_layer_object_used_twice():
    d, r, inner = nn.Dense(6), nn.ReLU(), nn.Serial(nn.Dense(6, "gelu"))
    shared = nn.Serial(d, r, d, r, inner, inner, nn.Dense(2))
    fresh = nn.Serial(nn.Dense(6), nn.ReLU(), nn.Dense(6), nn.ReLU(),
                      nn.Serial(nn.Dense(6, "gelu")), nn.Serial(nn.Dense(6, "gelu")), nn.Dense(2))
    _, p = shared.init(KEY, 6)
    _, p2 = fresh.init(KEY, 6)
    assert ff.tree.structure(p) == ff.tree.structure(p2)
    assert not np.array_equal(p[0]["w"], p[2]["w"])  # one key per position, not per object
    p = _perturbed(p, np.float64)
    x = _randn(1, 3, 6, dtype=np.float64)
    y, res = shared.forward(p, x)
    np.testing.assert_array_equal(y, fresh.forward(p, x)[0])
    g, dx = shared.backward(p, res, np.ones_like(y))
    g2, dx2 = fresh.backward(p, fresh.forward(p, x)[1], np.ones_like(y))
    np.testing.assert_array_equal(dx, dx2)
    for a, b in zip(ff.tree.leaves(g), ff.tree.leaves(g2), strict=True):
        np.testing.assert_array_equal(a, b)
    ff.check_grads(shared, p, x, max_checks=8)


def test_empty_serial_is_the_identity():
    e = nn.Serial()
    assert e.init(KEY, 4) == ((4,), ()) and e.init(KEY, (2, 3)) == ((2, 3), ())
    x = _randn(0, 3, 4)
    y, res = e.forward((), x)
    assert y is x and res == ()
    grads, dx = e.backward((), res, x)
    assert grads == () and dx is x
    assert e.softmax_head is None and e.apply((), x) is x
    assert nn.Serial([]).stages == [] and nn.Serial(()).layers == ()


@pytest.mark.parametrize("in_shape,out", [(6, (3,)), ((6,), (3,)), ((2, 3), (3,)),
                                          ((2, 1, 3), (3,))])
def test_init_shapes_of_nested_models(in_shape, out):
    flatten = len(ff.nn._layer.shape_tuple(in_shape)) > 1
    first = (nn.Flatten(),) if flatten else ()
    model = nn.Serial(nn.Serial(*first, nn.Dense(4, "relu")), nn.Serial(nn.Dense(3)))
    shape, params = model.init(KEY, in_shape)
    assert shape == out
    assert params[0][-1]["w"].shape == (4, 6) and params[1][0]["w"].shape == (3, 4)


def test_param_paths_and_checkpoint_round_trip(tmp_path):
    model = nn.Serial(nn.Dense(3), nn.Serial(), nn.Serial(nn.ReLU(), nn.Serial(nn.Dense(2))),
                      nn.Serial(nn.LayerNorm()))
    _, params = model.init(KEY, 5)
    paths = ff.tree.paths(params)
    assert paths == ["0/b", "0/w", "2/1/0/b", "2/1/0/w", "3/0/bias", "3/0/scale"]
    params = _perturbed(params)
    ff.checkpoint.save(tmp_path / "p.ff", params)
    x = _randn(2, 4, 5)
    for like in (None, params):
        back = ff.checkpoint.load(tmp_path / "p.ff", like=like)
        assert ff.tree.structure(back) == ff.tree.structure(params)
        np.testing.assert_array_equal(model.apply(back, x), model.apply(params, x))
    # params of the same layers without the nesting are another model's: refused by name
    flat = nn.Serial(nn.Dense(3), nn.ReLU(), nn.Dense(2), nn.LayerNorm())
    with pytest.raises(nn.LayerError, match=r"^Serial layer 1 \(Serial\(\)\): params must be "
                       r"a tuple with one entry per layer \(0\), got dict"):
        model.forward(flat.init(KEY, 5)[1], x)


def test_errors_name_the_nested_layer_position():
    model = nn.Serial(nn.Dense(7), nn.Serial(nn.ReLU(), nn.Serial(nn.Dense(5))), nn.Dense(3))
    _, params = model.init(KEY, 6)
    x = _randn(0, 4, 6)
    with pytest.raises(nn.LayerError, match=r"^Serial layer 0 \(Serial\(Dense\(5\)\)\): "
                       r"Serial layer 0 \(Dense\(5\)\): in_shape must be \(features,\)"):
        nn.Serial(nn.Serial(nn.Dense(5))).init(KEY, (2, 3))
    first = nn.Serial(nn.Serial(nn.LayerNorm(), nn.Dense(5)), nn.Dense(2))
    _, pfirst = first.init(KEY, 6)
    with pytest.raises(nn.LayerError, match=r"^Serial layer 0 \(Serial\(LayerNorm\(\), "
                       r"Dense\(5\)\)\): Serial layer 0 \(LayerNorm\(\)\): expected input of "
                       r"shape \(batch, 6\), got \(4, 8\)"):
        first.forward(pfirst, _randn(0, 4, 8))
    last = nn.Serial(nn.Dense(7), nn.Serial(nn.Dense(5)))
    _, plast = last.init(KEY, 6)
    y, res = last.forward(plast, x)
    with pytest.raises(nn.LayerError, match=r"^Serial layer 1 \(Serial\(Dense\(5\)\)\): Serial "
                       r"layer 0 \(Dense\(5\)\): expected dy of shape \(batch, 5\), got \(4, 3\)"):
        last.backward(plast, res, np.ones((4, 3), np.float32))
    bad = (params[0], (params[1][0], {"w": params[2]["w"]}), params[2])
    with pytest.raises(nn.LayerError, match=r"^Serial layer 1 \(Serial\(ReLU\(\), "
                       r"Serial\(Dense\(5\)\)\)\): Serial layer 1 \(Serial\(Dense\(5\)\)\): "
                       r"params must be a tuple with one entry per layer \(1\), got dict"):
        model.forward(bad, x)
    _, res = model.forward(params, x, train=False)
    with pytest.raises(nn.LayerError, match=r"^Serial layer 1 \(Serial\(ReLU\(\), .*\)\): "
                       r"Serial layer 0 \(ReLU\(\)\): residuals have no 'relu_aux'"):
        model.backward(params, res, np.ones((4, 3), np.float32))
