"""Audit of ff.mixed_precision against references written here in plain NumPy: the dynamic
loss-scaling rule, skipped steps, the float16 compute copy, unscaling, checkpoints, and the
checks of bad arguments (NumPy backend)."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn

XENT = ff.losses.softmax_cross_entropy


class Gain(nn.Layer):
    """y = g * x with a 0-d learnable gain (docs/custom-layers.md: a 0-d leaf)."""

    def init(self, key, in_shape):
        return tuple(in_shape), {"g": np.asarray(1.5, np.float32)}

    def forward(self, params, x, *, key=None, train=True):
        return x * params["g"].astype(x.dtype), ({"x": x} if train else {})

    def backward(self, params, residuals, dy):
        x = residuals["x"]
        return {"g": np.asarray((dy * x).sum(), params["g"].dtype)}, dy * params["g"]


def setup(seed=0, gain=False):
    layers = [nn.Dense(16, "gelu"), Gain(), nn.Dense(5)] if gain else \
        [nn.Dense(16, "relu"), nn.Dense(5)]
    model = nn.Serial(*layers)
    _, params = model.init(ff.random.key(seed), (8,))
    rng = np.random.default_rng(seed)
    params = ff.tree.map(  # away from init's special values (zero biases, gain 1.5)
        lambda p: np.asarray(p + 0.1 * rng.standard_normal(p.shape), np.float32), params)
    x = rng.standard_normal((12, 8)).astype(np.float32)
    return model, params, x, rng.integers(0, 5, 12)


def leaves_equal(a, b, printed=False):
    """Same structure (``printed``: as printed, for a state loaded without ``like``, whose
    namedtuples are classes of their own), dtypes and bits."""
    la, lb = ff.tree.leaves(a), ff.tree.leaves(b)
    sa, sb = ff.tree.structure(a), ff.tree.structure(b)
    return (str(sa) == str(sb) if printed else sa == sb) and all(
        u.dtype == v.dtype and np.array_equal(u, v, equal_nan=True) for u, v in zip(la, lb))


def assert_copy_current(state, params, dtype=np.float16):
    for p, low in zip(ff.tree.leaves(params), ff.tree.leaves(state.compute_params)):
        assert low.dtype == dtype
        np.testing.assert_array_equal(low, p.astype(dtype))


# ---- the loss-scaling rule and skipped steps, against a NumPy reference ----

def adamw_reference(params, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    m = {k: np.zeros(v.shape) for k, v in params.items()}
    v_ = {k: np.zeros(v.shape) for k, v in params.items()}
    t = [0]

    def step(p, g):
        t[0] += 1
        out = {}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v_[k] = b2 * v_[k] + (1 - b2) * g[k] ** 2
            mh, vh = m[k] / (1 - b1 ** t[0]), v_[k] / (1 - b2 ** t[0])
            out[k] = p[k] - lr * (mh / (np.sqrt(vh) + eps) + wd * p[k])
        return out
    return step


@pytest.mark.parametrize("path", ["update", "update_and_apply"])
@pytest.mark.parametrize("copy", [None, "float16"])
def test_scaling_rule_and_skipped_steps_match_a_numpy_reference(path, copy):
    """Skip on inf/nan (params and adamw's state bitwise unchanged, scale halves, count
    resets, never below min_scale), double after growth_interval good steps; the good
    steps follow a float64 adamw; the compute copy equals params.astype(float16) always."""
    rng = np.random.default_rng(11)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32),
              "b": rng.standard_normal(3).astype(np.float32)}
    opt = mp.dynamic_loss_scaling(ff.optim.adamw(1e-2, weight_decay=0.1), init_scale=4.0,
                                  growth_interval=3, min_scale=2.0, compute_dtype=copy)
    state, p = opt.init(params), params
    ref = adamw_reference(params, 1e-2, 0.1)
    rp = {k: v.astype(np.float64) for k, v in params.items()}
    scale, good = 4.0, 0
    bad = [1, 2, 3, 4, 9, 13, 14, 20]
    for i in range(24):
        g = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        if i in bad:
            g["w"][i % 4, i % 3] = [np.inf, -np.inf, np.nan][i % 3]
        old_p, old_inner = p, state.inner
        if path == "update":
            updates, state = opt.update(g, state, p)
            p = ff.optim.apply_updates(p, updates)
        else:
            p, state = ff.optim.update_and_apply(opt, g, state, p)
        if i in bad:
            assert leaves_equal(p, old_p) and leaves_equal(state.inner, old_inner)
            scale, good = max(scale / 2, 2.0), 0
        else:
            rp = ref(rp, {k: v.astype(np.float64) for k, v in g.items()})
            good += 1
            if good == 3:
                scale, good = scale * 2, 0
        assert (float(state.scale), int(state.good_steps)) == (scale, good), i
        assert state.scale.dtype == np.float32 and state.good_steps.dtype == np.int32
        if copy:
            assert_copy_current(state, p)
    for k in p:
        np.testing.assert_allclose(p[k], rp[k], rtol=0, atol=5e-6)


def test_skipped_steps_do_not_advance_a_schedule_inside_a_chain():
    """chain(clip_by_global_norm, sgd(schedule, momentum)): a skipped step leaves the
    schedule's count, the momentum and the params as they were."""
    rng = np.random.default_rng(12)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32)}
    sched = ff.optim.linear_schedule(0.1, 0.01, 10)
    inner = ff.optim.chain(ff.optim.clip_by_global_norm(0.5), ff.optim.sgd(sched, momentum=0.9))
    opt = mp.dynamic_loss_scaling(inner, growth_interval=4, compute_dtype="float16")
    state, p = opt.init(params), params
    rp, trace, t = params["w"].astype(np.float64), 0.0, 0
    for i in range(20):
        g = rng.standard_normal((4, 3)).astype(np.float32)
        if i % 4 == 1:
            g[0, 0] = np.nan
        p, state = ff.optim.update_and_apply(opt, {"w": g}, state, p)
        if i % 4 != 1:
            g64 = g.astype(np.float64)
            trace = 0.9 * trace + g64 * min(1.0, 0.5 / np.sqrt((g64 ** 2).sum()))
            rp = rp - (0.1 + (0.01 - 0.1) * min(t, 10) / 10) * trace
            t += 1
    assert int(state.inner[1][1].count) == t == 15
    assert float(state.scale) == 2.0 ** 15 / 2 ** 5  # 5 skips, never 4 good steps in a row
    np.testing.assert_allclose(p["w"], rp, rtol=0, atol=1e-6)
    assert_copy_current(state, p)


def test_growth_stops_below_float32_overflow():
    """As PyTorch's GradScaler: a growth that would overflow float32 keeps the scale (and
    restarts the count); the scale never becomes inf."""
    params = {"w": np.random.default_rng(13).standard_normal(3).astype(np.float32)}
    opt = mp.dynamic_loss_scaling(ff.optim.sgd(0.1), init_scale=2.0 ** 126, growth_interval=1)
    state = opt.init(params)
    for want in (2.0 ** 127, 2.0 ** 127, 2.0 ** 127):
        _, state = opt.update({"w": params["w"] * 0.5}, state, params)
        assert float(state.scale) == want and int(state.good_steps) == 0


# ---- gradients ----

@pytest.mark.parametrize("compute, scale, rtol", [("float64", 3.0, 1e-5),
                                                  ("float16", 2.0 ** 12, 5e-2)])
def test_grads_match_float64_finite_differences(compute, scale, rtol):
    """The unscaled grads (a 0-d gain among the params) against central differences of the
    float64 loss; the loss itself against the float64 one."""
    model, params, x, y = setup(1, gain=True)
    loss, grads = mp.value_and_grad(model, XENT, compute)(params, x, y,
                                                          loss_scale=np.float32(scale))

    def loss64(leaves):
        p = ff.tree.unflatten(ff.tree.structure(params), leaves)
        out, _ = model.forward(p, x.astype(np.float64), train=True)
        return float(XENT(out, y)[0])

    base = [p.astype(np.float64) for p in ff.tree.leaves(params)]
    assert abs(float(loss) - loss64(base)) < (1e-6 if compute == "float64" else 1e-2)
    worst = 0.0
    for k, g in enumerate(ff.tree.leaves(grads)):
        assert g.dtype == np.float32
        for idx in list(np.ndindex(g.shape))[:5]:
            plus, minus = [a.copy() for a in base], [a.copy() for a in base]
            plus[k][idx] += 1e-4
            minus[k][idx] -= 1e-4
            fd = (loss64(plus) - loss64(minus)) / 2e-4
            worst = max(worst, abs(g[idx] - fd) / (1e-3 + abs(fd)))
    assert worst < rtol


def test_float64_compute_keeps_float64_precision():
    """compute_dtype='float64' on float64 params is ff.value_and_grad's result: the loss
    used to be computed from logits cast down to float32 (errors of ~5e-8)."""
    model, params, x, y = setup(2)
    p64 = ff.tree.map(lambda p: p.astype(np.float64), params)
    x64 = x.astype(np.float64)
    loss0, g0 = ff.value_and_grad(model, XENT)(p64, x64, y)
    loss, g = mp.value_and_grad(model, XENT, "float64")(p64, x64, y, loss_scale=1024.0)
    assert np.asarray(loss).dtype == np.float64 and float(loss) == float(loss0)
    for a, b in zip(ff.tree.leaves(g), ff.tree.leaves(g0)):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_zero_d_param_gets_a_0d_array_gradient_as_in_float32():
    """NumPy's 0-d arithmetic gives scalars; the gradient of a 0-d param was an np.float32
    (ff.value_and_grad gives a 0-d array), which in-place code cannot write into."""
    model, params, x, y = setup(3, gain=True)
    _, g32 = ff.value_and_grad(model, XENT)(params, x, y)
    _, g = mp.value_and_grad(model, XENT)(params, x, y, loss_scale=np.float32(8))
    assert type(g32[1]["g"]) is np.ndarray and type(g[1]["g"]) is np.ndarray
    g[1]["g"][...] = 0.0
    assert type(mp.unscale(g, params, 2.0)[1]["g"]) is np.ndarray


@pytest.mark.parametrize("mixed", [False, True])
def test_float16_param_leaves_are_unscaled_in_float32(mixed):
    """1 / 2**25 is 0 in float16: a float16 param's gradient became exactly 0 (and the
    step counted as good). Now the product is formed in float32, as the GPU kernel does."""
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float16)}
    if mixed:
        params["v"] = rng.standard_normal(3).astype(np.float32)
    scale = np.float32(2.0 ** 25)
    g = {k: (rng.standard_normal(p.shape) * 1e-4 * scale).astype(np.float16)
         for k, p in params.items()}
    out = mp.unscale(g, params, scale)
    for k, p in params.items():
        want = (g[k].astype(np.float32) / scale).astype(p.dtype)
        assert out[k].dtype == p.dtype and np.abs(want).min() > 0
        np.testing.assert_array_equal(out[k], want)


# ---- the scaled-gradient path and the compute copy ----

@pytest.mark.parametrize("inner", [
    lambda: ff.optim.adam(1e-2), lambda: ff.optim.adamw(1e-2, weight_decay=0.1),
    lambda: ff.optim.sgd(0.1),
    lambda: ff.optim.chain(ff.optim.clip_by_global_norm(0.1), ff.optim.sgd(0.1, momentum=0.9))])
@pytest.mark.parametrize("scale", [2.0 ** 10, 2.0 ** 30])  # the second overflows float16
def test_update_and_apply_scaled_is_unscale_then_update(inner, scale):
    """The docstring's claim, bit for bit, with and without the compute copy."""
    model, params, x, y = setup(5)
    _, gs = mp.value_and_grad(model, XENT, unscaled=False)(params, x, y, loss_scale=scale)
    _, gu = mp.value_and_grad(model, XENT)(params, x, y, loss_scale=scale)
    assert all(g.dtype == np.float16 for g in ff.tree.leaves(gs))
    assert leaves_equal(mp.unscale(gs, params, np.float32(scale)), gu)
    for copy in (None, "float16"):
        opt = mp.dynamic_loss_scaling(inner(), init_scale=scale, compute_dtype=copy)
        state = opt.init(params)
        a = mp.update_and_apply_scaled(opt, gs, state, params)
        b = ff.optim.update_and_apply(opt, gu, state, params)
        assert leaves_equal(a, b)
        if scale == 2.0 ** 30:  # skipped
            assert leaves_equal(a[0], params) and float(a[1].scale) == scale / 2
        if copy:
            assert_copy_current(a[1], a[0])


def test_make_step_resumes_from_a_checkpoint_identically(tmp_path):
    """make_step in float16 with the compute copy, overflow skips included: a run saved
    after 4 steps (ff.train.save_state) and resumed with load_state, or with
    ff.checkpoint.load without like, ends bit for bit where the uninterrupted run does; the
    copy is params.astype(float16) after every step."""
    model, params, _, _ = setup(6)
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((8, 12, 8)).astype(np.float32)
    ys = rng.integers(0, 5, (8, 12))
    opt = mp.dynamic_loss_scaling(ff.optim.adamw(1e-2, weight_decay=0.1), init_scale=2.0 ** 20,
                                  growth_interval=2, compute_dtype="float16")
    step = ff.train.make_step(model, XENT, opt, compute_dtype="float16")
    start = ff.train.init_state(model, opt, (8,), ff.random.key(6))

    def run(p, s, a, b):
        for i in range(a, b):
            p, s, _ = step(p, s, xs[i], ys[i])
            assert_copy_current(s, p)
        return p, s

    end = run(start.params, start.opt_state, 0, 8)
    assert float(end[1].scale) < 2.0 ** 20  # some steps overflowed and were skipped
    p4, s4 = run(start.params, start.opt_state, 0, 4)
    path = tmp_path / "mp.safetensors"
    ff.train.save_state(path, start._replace(params=p4, opt_state=s4, step=4))
    for loaded in (ff.train.load_state(path, like=start), ff.checkpoint.load(path)):
        assert leaves_equal(run(loaded.params, loaded.opt_state, 4, 8), end, printed=True)


def test_refresh_compute_params_checks_the_params_fit_the_copy():
    """Params of another model used to become the copy silently (the error came later, at
    value_and_grad, telling to pass opt_state.compute_params)."""
    model, params, _, _ = setup(7)
    opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-3), compute_dtype="float16")
    state = opt.init(params)
    with pytest.raises(ValueError, match="refresh_compute_params: params must have the "
                                         "structure and shapes of the compute copy"):
        mp.refresh_compute_params(state, params[:1])
    with pytest.raises(ValueError, match="opt.init"):
        mp.refresh_compute_params(state, ff.tree.map(lambda p: p[:1], params))


# ---- bad arguments ----

@pytest.mark.parametrize("bad, error", [
    (None, TypeError), ("1024", TypeError), (True, TypeError), (0, ValueError),
    (-4.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    (1e39, ValueError), (np.ones(3, np.float32), TypeError), (np.asarray(0.0), ValueError)])
def test_loss_scale_is_checked(bad, error):
    """loss_scale=None became NaN and made every gradient NaN without an error; a scale of
    0 did the same; a (3,) array or a str gave NumPy's errors, or worked."""
    model, params, x, y = setup(8)
    f = mp.value_and_grad(model, XENT)
    with pytest.raises(error, match="mixed precision value_and_grad: loss_scale must be .*"
                                    "Fix: loss_scale=opt_state.scale"):
        f(params, x, y, loss_scale=bad)
    with pytest.raises(error, match="unscale: loss_scale"):
        mp.unscale(params, params, bad)
    state = mp.dynamic_loss_scaling(ff.optim.sgd(0.1)).init(params)
    with pytest.raises(TypeError, match="got DynamicScaleState"):  # the state, not its scale
        f(params, x, y, loss_scale=state)
    ref = f(params, x, y, loss_scale=state.scale)  # what is accepted: numbers, 0-d arrays
    for ok in (1024, 1024.0, np.float32(1024), np.asarray(1024, np.int32)):
        assert leaves_equal(f(params, x, y, loss_scale=ok), ref)


def test_integer_params_are_refused_not_given_zero_gradients():
    """The forward runs on the float16 cast, so no layer saw the int params, and their
    gradients were cast back to int32: all 0, without an error."""
    model, params, x, y = setup(9)
    ints = ff.tree.map(lambda p: (p * 100).astype(np.int32), params)
    with pytest.raises(TypeError, match=r"value_and_grad: the params at '0/\w' are int32.*"
                                        r"Fix: ff.tree.astype\(params, np.float32\)"):
        mp.value_and_grad(model, XENT)(ints, x, y, loss_scale=1024.0)


@pytest.mark.parametrize("copy", [None, "float16"])
def test_update_and_apply_scaled_checks_the_grads_structure(copy):
    """For an inner optimizer without a fused form (a chain), the unscaling put the grads
    into the params' structure first: renamed keys or a list passed silently, a missing
    leaf gave optree's 'Too few leaves'. Now: update_and_apply's error."""
    rng = np.random.default_rng(10)
    params = {"b": rng.standard_normal(3).astype(np.float32),
              "w": rng.standard_normal((4, 3)).astype(np.float32)}
    inner = ff.optim.chain(ff.optim.clip_by_global_norm(1.0), ff.optim.sgd(0.1))
    opt = mp.dynamic_loss_scaling(inner, compute_dtype=copy)
    state = opt.init(params)
    a, z = rng.standard_normal(3).astype(np.float16), rng.standard_normal((4, 3)).astype(np.float16)
    for grads in ({"a": a, "z": z}, [a, z], {"b": a}):
        with pytest.raises(ValueError, match="update_and_apply_scaled: the updates have "
                                             "structure .* but the params have"):
            mp.update_and_apply_scaled(opt, grads, state, params)
        with pytest.raises(ValueError, match="unscale: the updates have structure"):
            mp.unscale(grads, params, 2.0)
    with pytest.raises(ValueError, match="the update at 'b' has shape"):
        mp.update_and_apply_scaled(opt, {"b": a[None], "w": z}, state, params)


def test_compute_dtype_names_are_checked():
    model, params, x, y = setup(11)
    for bad in ("float8_e4m3fn", "int8", "float8", None, 16):
        with pytest.raises(ValueError, match=f"compute dtype must be one of .*got {bad}"):
            mp.value_and_grad(model, XENT, bad)
    for bad in ("float8_e4m3fn", "int8"):
        with pytest.raises(ValueError, match=f"got {bad}.*Fix: compute_dtype='bfloat16' or"):
            mp.dynamic_loss_scaling(ff.optim.sgd(0.1), compute_dtype=bad)
    for ok in (np.float16, "f2", "half"):
        assert mp.dynamic_loss_scaling(ff.optim.sgd(0.1), compute_dtype=ok).init(
            params).compute_params[0]["w"].dtype == np.float16


def test_make_step_names_a_bad_compute_dtype():
    model, _, _, _ = setup(12)
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        ff.train.make_step(model, XENT, mp.dynamic_loss_scaling(ff.optim.sgd(0.1)),
                           compute_dtype="float8_e4m3fn")
