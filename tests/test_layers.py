"""Every layer, forward and backward, against finite differences (float64) and against the
textbook unfused composition in tests/reference.py."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from tests import reference as ref

RNG_SHAPES = [(1, 1, 1, 1), (1, 5, 3, 2), (4, 9, 17, 3), (3, 37, 8, 37), (6, 12, 24, 10),
              (2, 23, 31, 1)]


def init64(model, in_features, seed=0):
    _, params = model.init(ff.random.key(seed), (in_features,))
    return ff.tree.astype(params, np.float64)


def randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("layer", [
    nn.Dense(7), nn.Dense(7, "relu"), nn.Dense(7, "gelu"), nn.Dense(7, use_bias=False),
    nn.Dense(9, "relu", use_bias=False), nn.Dense(1, "gelu"), nn.ReLU(), nn.GELU(),
    nn.LayerNorm(), nn.Dropout(0.3), nn.Flatten(),
    nn.Serial(nn.Dense(13, "relu"), nn.Dense(11, "gelu"), nn.Dense(3)),
    nn.Serial(nn.Dense(13), nn.ReLU(), nn.Dense(5), nn.GELU(), nn.Dense(2)),
    nn.Serial(nn.Dense(8, "relu"), nn.Dropout(0.5), nn.LayerNorm(),
              nn.Dense(9, "relu", use_bias=False), nn.Dense(4)),
], ids=repr)
@pytest.mark.parametrize("batch", [1, 5])
def test_layer_matches_finite_differences(layer, batch):
    params = init64(layer, 11, seed=batch)
    # Random (non-zero) biases and norm scales: finite differences are meaningless at a
    # ReLU kink, so keep pre-activations away from exact zero here (zeros are tested below).
    params = ff.tree.map(lambda p: p + 0.3 * randn(p.size, *p.shape), params)
    x = randn(batch + 10, batch, 11)
    report = ff.check_grads(layer, params, x, key=ff.random.key(3))
    assert report.max_error < 1.0 and report.checked > 0


def test_check_grads_reports_a_wrong_backward():
    class BadScale(nn.Layer):
        def init(self, key, in_shape):
            return in_shape, {"s": np.ones(in_shape)}

        def forward(self, params, x, *, key=None, train=True):
            return x * params["s"], {"x": x}

        def backward(self, params, residuals, dy):
            return {"s": (dy * residuals["x"]).sum(0)}, dy * params["s"] * 1.01  # wrong dx

    with pytest.raises(ff.GradientCheckError, match=r"worst at x\["):
        ff.check_grads(BadScale(), {"s": randn(0, 4)}, randn(1, 3, 4))


@pytest.mark.parametrize("batch,inp,hidden,out", RNG_SHAPES)
@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("split_activation", [False, True])
def test_fused_mlp_matches_unfused_reference(batch, inp, hidden, out, act, split_activation):
    """Dense(act) -> Dense(act) -> Dense, fused, against the textbook composition."""
    if split_activation:
        act_layer = nn.ReLU if act == "relu" else nn.GELU
        model = nn.Serial(nn.Dense(hidden), act_layer(), nn.Dense(hidden + 3), act_layer(),
                          nn.Dense(out))
    else:
        model = nn.Serial(nn.Dense(hidden, act), nn.Dense(hidden + 3, act), nn.Dense(out))
    params = init64(model, inp, seed=hidden)
    x = randn(inp, batch, inp)
    x[0] = 0.0  # with zero biases: exact-zero pre-activations in the first layer
    dense_params = [p for p in params if p]
    y_ref, grad_ref = ref.mlp(dense_params, x, [act, act, None])
    y, res = model.forward(params, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    if act == "relu":
        first = res[0]
        assert set(first) == {"x", "relu_aux"}
        np.testing.assert_array_equal(ref.relu_aux_bits(first["relu_aux"], hidden, batch),
                                      x @ params[0]["w"].T + params[0]["b"] >= 0)
    dy = randn(out, batch, out)
    grads, dx = model.backward(params, res, dy)
    g_ref, dx_ref = grad_ref(dy)
    for g, gr in zip([g for g in grads if g], g_ref):
        for k in gr:
            np.testing.assert_allclose(g[k], gr[k], rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-11, atol=1e-11)


def test_zero_preactivation_passes_gradient():
    """At exactly zero the mask is set (cuBLASLt's >= 0), unlike PyTorch/JAX (> 0)."""
    layer = nn.Dense(3, "relu")
    params = {"w": np.ones((3, 2)), "b": np.zeros(3)}
    x = np.zeros((1, 2))
    y, res = layer.forward(params, x)
    grads, dx = layer.backward(params, res, np.ones((1, 3)))
    np.testing.assert_array_equal(y, 0.0)
    np.testing.assert_array_equal(grads["b"], 1.0)  # PyTorch would give 0 here


def test_garbage_in_relu_aux_padding_changes_nothing():
    model = nn.Serial(nn.Dense(13, "relu"), nn.Dense(5))
    params = init64(model, 6)
    x = randn(0, 4, 6)
    y, res = model.forward(params, x)
    dy = randn(1, 4, 5)
    clean = model.backward(params, res, dy)
    rng = np.random.default_rng(0)
    dirty_aux = ref.fill_padding_with_garbage(res[0]["relu_aux"], 13, rng)
    assert not np.array_equal(dirty_aux, res[0]["relu_aux"])
    dirty = model.backward(params, (dict(res[0], relu_aux=dirty_aux), res[1]), dy)
    for a, b in zip(ff.tree.leaves(clean), ff.tree.leaves(dirty)):
        np.testing.assert_array_equal(a, b)


def test_fused_and_unfused_engine_paths_agree():
    """Dropout(0.0) between two layers blocks fusion: the fallback path must give the same."""
    fused = nn.Serial(nn.Dense(10, "relu"), nn.Dense(4))
    unfused = nn.Serial(nn.Dense(10, "relu"), nn.Dropout(0.0), nn.Dense(4))
    params = init64(fused, 7)
    params_u = (params[0], {}, params[1])
    x, dy = randn(0, 6, 7), randn(1, 6, 4)
    yf, rf = fused.forward(params, x)
    yu, ru = unfused.forward(params_u, x)
    np.testing.assert_array_equal(yf, yu)
    gf, dxf = fused.backward(params, rf, dy)
    gu, dxu = unfused.backward(params_u, ru, dy)
    for a, b in zip(ff.tree.leaves(gf), ff.tree.leaves((gu[0], gu[2]))):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dxf, dxu, rtol=1e-13)


@pytest.mark.parametrize("split_activation", [False, True])
def test_backward_fuses_mask_and_bias_into_one_matmul(split_activation):
    """Dense(relu) -> Dense: the boundary costs ONE DRELU_BGRAD matmul, no mask or sum step."""
    layers = ((nn.Dense(16), nn.ReLU(), nn.Dense(10)) if split_activation
              else (nn.Dense(16, "relu"), nn.Dense(10)))
    model = nn.Serial(*layers)
    _, params = model.init(ff.random.key(0), (20,))
    x = randn(0, 8, 20).astype(np.float32)
    be = ff.backend.get("numpy")
    y, res = model.forward(params, x)
    assert dict(be.calls) == {"linear/RELU_AUX_BIAS": 1, "linear/BIAS": 1} or be.calls
    be.reset_stats()
    model.backward(params, res, np.ones_like(y), need_input_grad=False)
    assert dict(be.calls) == {
        "linear_wgrad/BGRADB": 1,        # top layer: dW and db in one call
        "linear_dgrad/DRELU_BGRAD": 1,   # the boundary: masked dh AND the lower db
        "linear_wgrad/DEFAULT": 1,       # lower layer: dW only, its db is already known
    }
    be.reset_stats()
    model.forward(params, x)
    assert dict(be.calls) == {"linear/RELU_AUX_BIAS": 1, "linear/BIAS": 1}


def test_inference_forward_writes_no_mask():
    model = nn.Serial(nn.Dense(16, "relu"), nn.Dense(3))
    _, params = model.init(ff.random.key(0), (5,))
    x = randn(0, 4, 5).astype(np.float32)
    be = ff.backend.get("numpy")
    be.reset_stats()
    y, res = model.forward(params, x, train=False)
    assert "relu_aux" not in res[0] and be.calls["linear/RELU_BIAS"] == 1
    np.testing.assert_array_equal(y, model.forward(params, x)[0])
    np.testing.assert_array_equal(y, model.apply(params, x))


def test_dropout_is_reproducible_from_its_key_and_identity_in_inference():
    layer = nn.Dropout(0.5)
    x = np.ones((64, 32), np.float32)
    y1, _ = layer.forward({}, x, key=ff.random.key(1))
    y2, _ = layer.forward({}, x, key=ff.random.key(1))
    y3, _ = layer.forward({}, x, key=ff.random.key(2))
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(y1, y3)
    assert set(np.unique(y1)) == {0.0, 2.0} and 0.4 < (y1 == 0).mean() < 0.6
    np.testing.assert_array_equal(layer.forward({}, x, train=False)[0], x)


def test_value_and_grad_matches_manual_forward_backward():
    model = nn.Serial(nn.Dense(12, "relu"), nn.Dense(4))
    params = init64(model, 6)
    x, labels = randn(0, 5, 6), np.array([0, 1, 2, 3, 1])
    (loss, logits), grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy,
                                              with_outputs=True)(params, x, labels)
    y, res = model.forward(params, x)
    loss_ref, dlogits = ff.losses.softmax_cross_entropy(y, labels)
    grads_ref, _ = model.backward(params, res, dlogits)
    assert float(loss) == float(loss_ref)
    np.testing.assert_array_equal(logits, y)
    for a, b in zip(ff.tree.leaves(grads), ff.tree.leaves(grads_ref)):
        np.testing.assert_array_equal(a, b)


def test_backward_can_free_saved_arrays_as_it_goes():
    """``release_residuals=True`` (what value_and_grad asks for): every entry of the owned
    list is None afterwards, the gradients are unchanged, and a tuple is refused."""
    model = nn.Serial(nn.Dense(16), nn.ReLU(), nn.Dense(12, "gelu"), nn.Dropout(0.1),
                      nn.Dense(5))
    _, params = model.init(ff.random.key(3), (9,))
    x = np.random.default_rng(3).standard_normal((6, 9)).astype(np.float32)
    y, residuals = model.forward(params, x, key=ff.random.key(4))
    dy = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
    ref_grads, ref_dx = model.backward(params, residuals, dy)
    owned = list(residuals)
    grads, dx = model.backward(params, owned, dy, release_residuals=True)
    assert owned == [None] * len(model.layers)
    for a, b in zip(ff.tree.leaves((grads, dx)), ff.tree.leaves((ref_grads, ref_dx))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="list"):
        model.backward(params, residuals, dy, release_residuals=True)


def test_value_and_grad_takes_any_layer_and_any_residuals():
    """A bare Dense (dict residuals), a Serial subclass whose backward lacks
    release_residuals, and mixed precision: value_and_grad hands each backward the
    residuals it expects and gives the manual forward/backward's gradients."""
    x = randn(1, 5, 6).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 1])

    class Plain(nn.Serial):
        def backward(self, params, residuals, dy, *, need_input_grad=True):
            assert isinstance(residuals, tuple)
            return super().backward(params, residuals, dy, need_input_grad=need_input_grad)

    for model in (nn.Dense(4), Plain(nn.Dense(8, "relu"), nn.Dense(4))):
        _, params = model.init(ff.random.key(2), (6,))
        loss, grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(params, x, labels)
        y, res = model.forward(params, x)
        loss_ref, dlogits = ff.losses.softmax_cross_entropy(y, labels)
        grads_ref, _ = model.backward(params, res, dlogits)
        assert float(loss) == float(loss_ref)
        for a, b in zip(ff.tree.leaves(grads), ff.tree.leaves(grads_ref)):
            np.testing.assert_array_equal(a, b)
        loss16, grads16 = ff.mixed_precision.value_and_grad(
            model, ff.losses.softmax_cross_entropy)(params, x, labels)
        assert abs(float(loss16) - float(loss_ref)) < 1e-2
        for a, b in zip(ff.tree.leaves(grads16), ff.tree.leaves(grads_ref)):
            np.testing.assert_allclose(a, b, rtol=0.05, atol=5e-3)
