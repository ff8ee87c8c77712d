"""float16 compute with float32 master weights and dynamic loss scaling (NumPy backend)."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn


def setup(seed=0):
    model = nn.Serial(nn.Dense(64, "relu"), nn.Dense(48, "gelu"), nn.Dense(10))
    _, params = model.init(ff.random.key(seed), (32,))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    return model, params, x, np.arange(16) % 10


def test_float16_grads_match_float32_grads():
    model, params, x, y = setup()
    loss32, g32 = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(params, x, y)
    loss16, g16 = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        params, x, y, loss_scale=np.float32(1024))
    assert abs(float(loss16) - float(loss32)) < 1e-2
    for a, b in zip(ff.tree.leaves(g16), ff.tree.leaves(g32)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=5e-2, atol=2e-3 * np.abs(b).max())


def test_loss_scale_keeps_small_gradients_from_flushing_to_zero():
    model, params, x, y = setup()
    tiny = ff.tree.map(lambda p: p * 1e-3, params)  # gradients around float16's subnormals
    _, unscaled = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)(tiny, x, y)
    _, scaled = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        tiny, x, y, loss_scale=np.float32(2 ** 15))
    _, exact = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(tiny, x, y)
    w = lambda g: g[0]["w"]
    err_scaled = np.abs(w(scaled) - w(exact)).max()
    err_unscaled = np.abs(w(unscaled) - w(exact)).max()
    assert err_scaled < err_unscaled / 10


def test_overflow_skips_the_step_and_halves_the_scale():
    model, params, x, y = setup()
    opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-3), init_scale=1e9)
    state = opt.init(params)
    _, grads = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        params, x, y, loss_scale=state.scale)
    assert not bool(mp.all_finite(grads))
    updates, new = opt.update(grads, state, params)
    assert all((u == 0).all() for u in ff.tree.leaves(updates))
    assert float(new.scale) == 5e8 and int(new.good_steps) == 0
    for a, b in zip(ff.tree.leaves(new.inner), ff.tree.leaves(state.inner)):
        np.testing.assert_array_equal(a, b)  # adam's moments and count untouched


def test_scale_grows_after_good_steps_and_training_converges():
    model, params, x, y = setup()
    opt = mp.dynamic_loss_scaling(ff.optim.adam(3e-3), init_scale=256.0, growth_interval=5)
    state = opt.init(params)
    grad_fn = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)
    losses = []
    for _ in range(60):
        loss, grads = grad_fn(params, x, y, loss_scale=state.scale)
        updates, state = opt.update(grads, state, params)
        params = ff.optim.apply_updates(params, updates)
        losses.append(float(loss))
    assert float(state.scale) == 256.0 * 2 ** 12
    assert all(p.dtype == np.float32 for p in ff.tree.leaves(params))
    assert losses[-1] < 0.05
    assert losses[0] > 2.0


def test_loss_gradient_scaled_by_the_loss_equals_the_composition():
    """softmax_cross_entropy's grad_scale/grad_dtype (what mixed precision asks for) on
    NumPy: the float32 gradient of the float32-cast logits, times the scale, cast."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((9, 10)) * 3).astype(np.float16)
    y = rng.integers(0, 10, 9)
    scale = np.asarray(2.0 ** 12, dtype=np.float32)
    loss32, g32 = ff.losses.softmax_cross_entropy(logits.astype(np.float32), y)
    loss, g = ff.losses.softmax_cross_entropy(logits, y, grad_scale=scale,
                                              grad_dtype=np.float16)
    assert g.dtype == np.float16 and float(loss) == float(loss32)
    np.testing.assert_array_equal(g, (g32 * scale).astype(np.float16))
    from fuseflow.train._labels import unchecked_cross_entropy  # what fit and the CLI use

    assert mp._takes_grad_scale(unchecked_cross_entropy)  # through the partial


def test_compute_params_give_the_same_loss_and_grads_and_are_checked():
    """value_and_grad(..., compute_params=the cast params) is the cast it skips; a copy of
    another dtype or structure is refused with the fix in the message."""
    model, params, x, y = setup()
    f = mp.value_and_grad(model, ff.losses.softmax_cross_entropy)
    low = ff.tree.map(lambda p: p.astype(np.float16), params)
    loss_a, g_a = f(params, x, y, loss_scale=np.float32(64))
    loss_b, g_b = f(params, x, y, loss_scale=np.float32(64), compute_params=low)
    assert float(loss_a) == float(loss_b)
    for a, b in zip(ff.tree.leaves(g_a), ff.tree.leaves(g_b)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="compute_params must be the params cast to float16"):
        f(params, x, y, compute_params=params)           # float32
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        f(params, x, y, compute_params=low[:1])           # another structure
    opt = mp.dynamic_loss_scaling(ff.optim.sgd(0.1), compute_dtype="float16")
    state = opt.init(params)
    for a, b in zip(ff.tree.leaves(state.compute_params), ff.tree.leaves(low)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        mp.dynamic_loss_scaling(ff.optim.sgd(0.1), compute_dtype="int8")


def test_refresh_compute_params_and_make_step_dtype_check():
    """Params changed outside the optimizer get a fresh copy from refresh_compute_params;
    make_step refuses a copy in another dtype than it computes in, with the fix."""
    model, params, x, y = setup()
    opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-3), compute_dtype="float16")
    state = opt.init(params)
    edited = ff.tree.map(lambda p: p * 0.5, params)
    fresh = mp.refresh_compute_params(state, edited)
    for p, low in zip(ff.tree.leaves(edited), ff.tree.leaves(fresh.compute_params)):
        np.testing.assert_array_equal(low, p.astype(np.float16))
    with pytest.raises(TypeError, match="keeps no compute copy"):
        mp.refresh_compute_params(mp.dynamic_loss_scaling(ff.optim.sgd(0.1)).init(params),
                                  params)
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="float16")
    p2, s2, metrics = step(params, state, x, y)  # runs on the copy, keeps it current
    for p, low in zip(ff.tree.leaves(p2), ff.tree.leaves(s2.compute_params)):
        np.testing.assert_array_equal(low, p.astype(np.float16))
    wide = mp.dynamic_loss_scaling(ff.optim.adam(1e-3), compute_dtype="float32")
    with pytest.raises(TypeError, match="keeps its compute copy in float32"):
        step(params, wide.init(params), x, y)
