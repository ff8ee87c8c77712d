"""From an audit of the optimizer extension point (docs/optimizers.md, "Writing your own
transform"): a user's own transforms (a Lion-style update, a gradient-noise wrapper, a
schedule), chained with the built-ins and used wherever a built-in optimizer works
(``update_and_apply``, ``make_step``, ``ff.compile``, ``dynamic_loss_scaling``, the
data-parallel step, ``fit`` with checkpoints and exact resumption), each checked against a
plain-NumPy reference written here; and custom states that hold non-array things.

Values are random (``rng``: a fresh seed per test, printed; ``FUSEFLOW_TEST_SEED`` repeats
one).
"""

import functools
from typing import Any, NamedTuple

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn, optim, tree
from fuseflow import train as T
from fuseflow._namespace import namespace

B1, B2, WD, CLIP = 0.9, 0.99, 1e-2, 1.0


# ---- the user's pieces ---------------------------------------------------------------

class LionState(NamedTuple):
    count: Any  # 0-d int32 array
    mu: Any     # pytree like params


def scale_by_lion(b1=B1, b2=B2):
    """Lion's direction sign(b1 * mu + (1 - b1) * g); mu follows g with b2."""
    def init(params):
        xp = namespace(tree.leaves(params)[0])
        return LionState(count=xp.zeros((), xp.int32), mu=tree.zeros_like(params))

    def update(updates, state, params=None):
        xp = namespace(state.count)
        out = tree.map(lambda g, m: xp.sign(b1 * m + (1 - b1) * g), updates, state.mu)
        mu = tree.map(lambda g, m: xp.asarray(b2 * m + (1 - b2) * g), updates, state.mu)
        return out, type(state)(count=xp.asarray(state.count + 1), mu=mu)

    return optim.GradientTransformation(init, update)


def warmup(count):
    """The user's schedule: linear warm-up to 1e-2 over 4 steps, on count's device."""
    return 1e-2 * namespace(count).minimum(1.0, (count + 1) / 4.0)


def lion():
    return optim.chain(optim.clip_by_global_norm(CLIP), scale_by_lion(),
                       optim.add_decayed_weights(WD), optim.scale_by_learning_rate(warmup))


def lion_reference(params, grads_list):
    """The same steps in plain NumPy (float32 arithmetic, as the params)."""
    p = {k: v.copy() for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in params.items()}
    f32 = np.float32
    for t, g in enumerate(grads_list):
        norm = np.sqrt(sum(np.sum(g[k] * g[k]) for k in sorted(g)))
        factor = f32(CLIP) / np.maximum(norm, f32(CLIP))
        lr = f32(1e-2 * min(1.0, (t + 1) / 4.0))
        for k in p:
            gk = g[k] * factor
            u = np.sign(f32(B1) * mu[k] + f32(1 - B1) * gk) + f32(WD) * p[k]
            mu[k] = f32(B2) * mu[k] + f32(1 - B2) * gk
            p[k] = p[k] - lr * u
    return p


def random_params(rng):
    return {"w": rng.standard_normal((4, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}


def random_grads(rng, params, scale=3.0):
    return tree.map(lambda p: (scale * rng.standard_normal(p.shape)).astype(p.dtype), params)


def assert_close(got, want):
    assert tree.structure(got) == tree.structure(want)
    for a, b in zip(tree.leaves(got), tree.leaves(want)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def assert_bits_equal(a, b):
    assert tree.structure(a) == tree.structure(b)
    for x, y in zip(tree.leaves(a), tree.leaves(b)):
        assert type(x) is type(y)
        assert np.array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def run(path, opt, params, grads_list):
    """``opt`` over ``grads_list`` along ``path``; returns (params, the inner opt state)."""
    state = opt.init(params)
    step = ff.compile(lambda p, s, g: (*optim.update_and_apply(opt, g, s, p), None))
    for g in grads_list:
        if path == "update":
            updates, state = opt.update(g, state, params)
            params = optim.apply_updates(params, updates)
        elif path == "compile":
            params, state, _ = step(params, state, g)
        else:
            params, state = optim.update_and_apply(opt, g, state, params)
    return params, state


# ---- 1. a user's chain, everywhere ----------------------------------------------------

@pytest.mark.parametrize("path", ["update", "update_and_apply", "compile"])
@pytest.mark.parametrize("wrapped", ["", "loss_scaled", "loss_scaled_f16_copy"])
def test_users_lion_chain_matches_numpy(rng, path, wrapped):
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(6)]
    opt = lion()
    if wrapped:
        cd = "float16" if wrapped.endswith("copy") else None
        opt = mp.dynamic_loss_scaling(opt, compute_dtype=cd)
    got, state = run(path, opt, params, grads)
    assert_close(got, lion_reference(params, grads))
    inner = state.inner if wrapped else state
    assert type(inner[1]) is LionState and int(inner[1].count) == 6
    if wrapped.endswith("copy"):  # the compute copy followed the user's updates
        assert_bits_equal(state.compute_params, tree.astype(got, np.float16))


@pytest.mark.parametrize("path", ["update", "update_and_apply"])
def test_loss_scaling_skips_a_non_finite_step_of_a_users_chain(rng, path):
    """The skipped step leaves the params and the user's state bit for bit, halves the
    scale, and the next steps are those of the inner chain alone."""
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(4)]
    bad = tree.map(np.copy, grads[0])
    bad["w"][rng.integers(4), rng.integers(3)] = np.nan
    opt = mp.dynamic_loss_scaling(lion(), init_scale=1024.0)
    p, s = params, opt.init(params)
    for g in [bad, *grads]:
        if path == "update":
            u, new = opt.update(g, s, p)
            new_p = optim.apply_updates(p, u)
        else:
            new_p, new = optim.update_and_apply(opt, g, s, p)
        if g is bad:
            assert_bits_equal((new_p, new.inner), (p, s.inner))
            assert float(new.scale) == 512.0
        p, s = new_p, new
    assert_close(p, lion_reference(params, grads))


@pytest.mark.parametrize("how", ["eager", "compiled", "data_parallel"])
def test_make_step_with_a_users_chain(rng, how):
    """make_step's update (update_and_apply, donated grads), compiled (the NumPy
    pass-through) or data-parallel (one process; the collective runs anyway)."""
    model = nn.Serial(nn.Dense(5, "relu"), nn.Dense(3))
    _, params0 = model.init(ff.random.key(int(rng.integers(1 << 30))), (6,))
    opt = lion()
    comm = ff.distributed.Communicator(None, always_reduce=True) if how == "data_parallel" \
        else None
    step = T.make_step(model, ff.losses.softmax_cross_entropy, opt, comm=comm)
    if how == "compiled":
        step = ff.compile(step)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    params, state, grads = params0, opt.init(params0), []
    for _ in range(5):
        x = rng.standard_normal((8, 6)).astype(np.float32)
        y = rng.integers(0, 3, 8)
        grads.append(grad_fn(params, x, y)[1])
        params, state, _ = step(params, state, x, y)
    flat = [{str(i): leaf for i, leaf in enumerate(tree.leaves(g))} for g in grads]
    want = lion_reference({str(i): leaf for i, leaf in enumerate(tree.leaves(params0))}, flat)
    got = {str(i): leaf for i, leaf in enumerate(tree.leaves(params))}
    assert_close(got, want)


# ---- 2. fit, checkpoints and exact resumption -----------------------------------------

def _fit_setup(rng):
    x = rng.standard_normal((120, 6)).astype(np.float32)
    y = rng.integers(0, 3, 120)
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    return model, (x, y)


def _fit(model, opt, state, data, epochs, out_dir, **kw):
    return T.fit(model, opt, state, data, None, epochs=epochs, batch_size=30,
                 out_dir=out_dir, progress=False, log=None, **kw)


def test_fit_resumes_a_users_chain_bit_for_bit(rng, tmp_path):
    model, data = _fit_setup(rng)
    opt = lion()
    fresh = T.init_state(model, opt, (6,), ff.random.key(int(rng.integers(1 << 30))))
    mid = []  # a state in the middle of epoch 2 (4 steps an epoch)
    full = _fit(model, opt, fresh, data, 3, tmp_path / "full",
                on_step=lambda s, m: mid.append(s) if s.step == 6 else None)
    first = _fit(model, opt, fresh, data, 1, tmp_path / "run")
    assert int(first.state.opt_state[1].count) == 4
    resumed = T.load_state(tmp_path / "run" / "last.safetensors", like=fresh)
    assert type(resumed.opt_state[1]) is LionState  # like's classes, not look-alikes
    assert_bits_equal(resumed, first.state)
    done = _fit(model, opt, resumed, data, 3, tmp_path / "run")
    assert_bits_equal(done.state, full.state)
    assert [r["train_loss"] for r in done.history] == [r["train_loss"] for r in full.history]
    # save_state / load_state of a state saved in the middle of epoch 2, resumed in a new
    # folder, gives the uninterrupted run as well
    T.save_state(tmp_path / "mid.safetensors", mid[0])
    again = T.load_state(tmp_path / "mid.safetensors", like=fresh)
    assert_bits_equal(again, mid[0])
    assert_bits_equal(_fit(model, opt, again, data, 3, tmp_path / "other").state, full.state)


# ---- 3. a wrapper made with functools.wraps -------------------------------------------

def add_noise(inner, noise):
    """A gradient-noise wrapper: ``inner`` on ``g + noise``. functools.wraps copies the
    wrapped update's attributes (adam's fused_spec, the loss scaler's fused_apply)."""
    @functools.wraps(inner.update)
    def update(updates, state, params=None):
        return inner.update(tree.map(lambda g, n: g + n, updates, noise), state, params)

    return optim.GradientTransformation(inner.init, update)


def numpy_adam(params, grads_list, lr):
    p = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    f32 = np.float32
    for t, g in enumerate(grads_list, 1):
        for k in p:
            m[k] = f32(0.1) * g[k] + f32(0.9) * m[k]
            v[k] = f32(1 - 0.999) * g[k] * g[k] + f32(0.999) * v[k]
            mh, vh = m[k] / (1 - f32(0.9) ** t), v[k] / (1 - f32(0.999) ** t)
            p[k] = p[k] - f32(lr) * (mh / (np.sqrt(vh) + f32(1e-8)))
    return p


@pytest.mark.parametrize("name", ["sgd", "adam"])
@pytest.mark.parametrize("how", ["plain", "loss_scaled_inside", "loss_scaled_outside"])
def test_a_wrapped_update_is_not_replaced_by_the_fused_step(rng, name, how):
    """update_and_apply ran the wrapped optimizer's fused step (inherited fused_spec), or
    the loss scaler's own step (inherited fused_apply), instead of the wrapper: the noise
    was silently left out. (Inside the loss scaler the inherited spec only reached the
    GPU kernel: on NumPy that case passed before too.)"""
    params = random_params(rng)
    noise = random_grads(rng, params, scale=0.5)
    grads = [random_grads(rng, params) for _ in range(3)]
    inner = optim.sgd(0.1) if name == "sgd" else optim.adam(1e-2)
    if how == "loss_scaled_outside":  # the scaler's hook runs its own step (compute copy)
        opt = add_noise(mp.dynamic_loss_scaling(inner, compute_dtype="float16"), noise)
    else:
        opt = add_noise(inner, noise)
        if how == "loss_scaled_inside":
            opt = mp.dynamic_loss_scaling(opt)
    got, _ = run("update_and_apply", opt, params, grads)
    noisy = [tree.map(lambda g, n: g + n, g, noise) for g in grads]
    if name == "sgd":
        want = params
        for g in noisy:
            want = {k: want[k] - np.float32(0.1) * g[k] for k in want}
    else:
        want = numpy_adam(params, noisy, 1e-2)
    assert_close(got, want)


def test_markers_of_the_wrapper_itself_are_kept():
    """Only the copies are dropped: a marker set on the wrapper (its own) still counts,
    and a built-in alias keeps its fused step."""
    from fuseflow.optim._base import own_attribute

    adam = optim.adam(1e-3)
    assert own_attribute(adam.update, "fused_spec")["kind"] == "adam"
    wrapped = add_noise(adam, {})
    assert own_attribute(wrapped.update, "fused_spec") is None
    assert own_attribute(wrapped.update, "check_args") is None
    wrapped.update.fused_spec = {"kind": "sgd"}
    assert own_attribute(wrapped.update, "fused_spec") == {"kind": "sgd"}


# ---- 4. what a user's schedule returns ------------------------------------------------

def _no_return(count):
    1e-3 * namespace(count).minimum(1.0, (count + 1) / 100)  # noqa: B018 (the mistake)


def _trailing_comma(count):
    return 1e-3 * namespace(count).minimum(1.0, (count + 1) / 100),


def _per_column(count):
    return np.full(3, 1e-3) * (count + 1)  # broadcast silently over a (4, 3) weight


OPTS = {"scale_by_schedule": optim.scale_by_schedule, "adam": optim.adam, "sgd": optim.sgd,
        "clip_then_sgd": lambda s: optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(s))}


@pytest.mark.parametrize("path", ["update", "update_and_apply"])
@pytest.mark.parametrize("make", sorted(OPTS))
@pytest.mark.parametrize("schedule, says", [(_no_return, "NoneType None"),
                                            (_trailing_comma, "a tuple of 1"),
                                            (_per_column, r"ndarray of shape \(3,\)")],
                         ids=["no_return", "trailing_comma", "per_column"])
def test_a_schedule_that_returns_no_step_size(rng, path, make, schedule, says):
    """It failed deep in the arithmetic ('NoneType' has no attribute 'astype'), or, for
    a vector, scaled each column by its own step size (silently on the reference path)."""
    params = random_params(rng)
    opt = OPTS[make](schedule)
    state = opt.init(params)
    said = f"schedule {schedule.__name__} returned {says}.*Fix: return"
    with pytest.raises(TypeError, match=said):
        if path == "update":
            opt.update(random_grads(rng, params), state, params)
        else:
            optim.update_and_apply(opt, random_grads(rng, params), state, params)


@pytest.mark.parametrize("value", [2e-3, 1, np.float64(2e-3), np.asarray(2e-3, np.float32),
                                   np.asarray(1, np.int32)], ids=repr)
@pytest.mark.parametrize("path", ["update", "update_and_apply"])
def test_a_schedule_may_return_a_number_or_a_0d_array(rng, value, path):
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(2)]
    got, _ = run(path, optim.sgd(lambda count: value), params, grads)
    lr = np.float32(value)
    assert_close(got, {k: params[k] - lr * grads[0][k] - lr * grads[1][k] for k in params})


def test_a_users_transform_that_widens_the_updates_is_named_in_the_fix(rng):
    """float32 gradients widened by the user's transform (a float64 0-d factor): the
    error's fix no longer only says to pass float32 gradients, which the user did."""
    def halve():
        def update(updates, state, params=None):
            return tree.map(lambda g: g * np.sqrt(np.asarray(0.25)), updates), state
        return optim.GradientTransformation(lambda p: optim.EmptyState(), update)

    params = random_params(rng)
    opt = optim.chain(halve(), optim.adam(1e-3))
    with pytest.raises(TypeError, match=r"a transform of your own before this one .* "
                                        r"s\.astype\(g\.dtype\)"):
        optim.update_and_apply(opt, random_grads(rng, params), opt.init(params), params)


# ---- 5. custom states that hold more than arrays --------------------------------------

class WithInt(NamedTuple):
    count: int    # a Python int: outside the documented contract (arrays only)
    mu: Any


class WithNone(NamedTuple):
    count: Any
    unused: Any   # None: an empty node
    mu: Any


def momentum_keeping(kind):
    """``mu = 0.9 * mu + g``, emitting mu, with its state in the shape ``kind`` says."""
    def pack(count, mu):
        if kind == "int":
            return WithInt(count, mu)
        if kind == "none":
            return WithNone(count, None, mu)
        if kind == "tuple":
            return (count, (mu,))
        return {"count": count, "inner": {"mu": mu, "nothing": None}}  # dict

    def unpack(state):
        if kind in ("int", "none"):
            return state.count, state.mu
        if kind == "tuple":
            return state[0], state[1][0]
        return state["count"], state["inner"]["mu"]

    def init(params):
        return pack(0 if kind == "int" else np.zeros((), np.int32), tree.zeros_like(params))

    def update(updates, state, params=None):
        count, mu = unpack(state)
        mu = tree.map(lambda g, m: np.asarray(0.9 * m + g), updates, mu)
        return mu, pack(count + 1 if kind == "int" else np.asarray(count + 1), mu)

    return optim.chain(optim.GradientTransformation(init, update), optim.sgd(0.1))


KINDS = ["int", "none", "tuple", "dict"]


@pytest.mark.parametrize("kind", KINDS)
def test_custom_states_step_and_round_trip_through_checkpoints(rng, tmp_path, kind):
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(3)]
    opt = momentum_keeping(kind)
    got, state = run("update_and_apply", opt, params, grads)
    ref, state_ref = run("update", opt, params, grads)
    assert_bits_equal((got, state), (ref, state_ref))
    mu, want = {k: np.zeros_like(v) for k, v in params.items()}, dict(params)
    for g in grads:
        mu = {k: np.float32(0.9) * mu[k] + g[k] for k in mu}
        want = {k: want[k] - np.float32(0.1) * mu[k] for k in want}
    assert_close(got, want)
    like = T.TrainState(params=params, opt_state=opt.init(params), step=0, epoch=0,
                        key=ff.random.key(0), batch_in_epoch=0, data_key=ff.random.key(1))
    saved = like._replace(params=got, opt_state=state, step=3)
    T.save_state(tmp_path / "s.safetensors", saved)
    assert_bits_equal(T.load_state(tmp_path / "s.safetensors", like=like), saved)


@pytest.mark.parametrize("kind", KINDS)
def test_custom_states_under_compile(rng, kind):
    """Arrays only (None is no leaf): the same results. A Python int: refused, naming
    the leaf and the fix, as docs/compile.md says."""
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(3)]
    opt = momentum_keeping(kind)
    if kind == "int":
        with pytest.raises(ff.CompileError, match=r"Python value 0 at '0/0'.*Fix: make it a "
                                                  r"0-d array"):
            run("compile", opt, params, grads)
        return
    assert_bits_equal(run("compile", opt, params, grads), run("update", opt, params, grads))


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "int"])
def test_custom_states_under_loss_scaling(rng, kind):
    params = random_params(rng)
    grads = [random_grads(rng, params) for _ in range(2)]
    bad = tree.map(lambda g: np.full_like(g, np.inf), grads[0])
    opt = mp.dynamic_loss_scaling(momentum_keeping(kind))
    _, state = run("update_and_apply", opt, params, grads)
    p_skip, skipped = optim.update_and_apply(opt, bad, state, params)
    assert_bits_equal((p_skip, skipped.inner), (params, state.inner))
    assert_bits_equal(state.inner, run("update", momentum_keeping(kind), params, grads)[1])


def test_loss_scaling_names_a_python_int_in_a_users_state(rng):
    params = random_params(rng)
    opt = mp.dynamic_loss_scaling(momentum_keeping("int"))
    with pytest.raises(TypeError, match=r"dynamic_loss_scaling.*'0/0'.*Fix:.*0-d array"):
        optim.update_and_apply(opt, random_grads(rng, params), opt.init(params), params)


def test_make_step_mixed_precision_runs_a_wrapped_loss_scaler(rng):
    model = nn.Serial(nn.Dense(4, "relu"), nn.Dense(3))
    _, params = model.init(ff.random.key(int(rng.integers(1 << 30))), (5,))
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    scaler = mp.dynamic_loss_scaling(optim.sgd(0.1), compute_dtype="float16")
    noisy = add_noise(scaler, tree.map(lambda p: np.full_like(p, 10.0), params))
    got = [T.make_step(model, ff.losses.softmax_cross_entropy, o, compute_dtype="float16")(
        params, o.init(params), x, y)[0] for o in (noisy, scaler)]
    for a, b in zip(tree.leaves(got[0]), tree.leaves(got[1])):
        np.testing.assert_allclose(a - b, -1.0, atol=1e-3)  # -lr * noise
