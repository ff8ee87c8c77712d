"""From an API audit of the optimizers, mixed precision and ``ff.compile``: states loaded
without ``like``, the loss-scale rule's arguments, gradients wider than the optimizer state,
``ff.compile``'s NumPy contract and ``donate_argnums``, 8-bit floats, empty trees.

Values are random (``rng``: a fresh seed per test, printed; ``FUSEFLOW_TEST_SEED`` repeats
one).
"""

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn, optim

INNER = {
    "adam": lambda: optim.adam(1e-3),
    "momentum": lambda: optim.sgd(0.05, momentum=0.9),
    "clip_adam": lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adam(1e-3)),
}


def random_params(rng):
    return {"w": rng.standard_normal((3, 2)).astype(np.float32),
            "b": rng.standard_normal(2).astype(np.float32)}


def random_grads(rng, params, dtype=None):
    return ff.tree.map(lambda p: rng.standard_normal(p.shape).astype(dtype or p.dtype), params)


def reload(tmp_path, tree):
    """``tree`` through a checkpoint loaded without ``like``: look-alike namedtuples."""
    ff.checkpoint.save(tmp_path / "s.safetensors", tree)
    return ff.checkpoint.load(tmp_path / "s.safetensors")


def assert_trees_equal(a, b):
    assert ff.tree.structure(a) == ff.tree.structure(b)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def leaves_equal(a, b):
    la, lb = ff.tree.leaves(a), ff.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


# ---- 1. a state loaded from a checkpoint without ``like`` ----------------------------

@pytest.mark.parametrize("path", ["update", "update_and_apply"])
@pytest.mark.parametrize("name", sorted(INNER))
def test_loss_scaled_state_loaded_without_like_steps(rng, tmp_path, name, path):
    """The wrapper accepts the loaded state (it raised "namedtuple type mismatch"), steps
    it exactly as the fresh one, through a skipped (non-finite) step too, and returns the
    loaded classes."""
    opt = mp.dynamic_loss_scaling(INNER[name](), growth_interval=2)
    params = random_params(rng)
    fresh = opt.init(params)
    loaded = reload(tmp_path, fresh)
    assert type(loaded) is not type(fresh)
    pf, pl, sf, sl = params, params, fresh, loaded
    for i in range(4):
        grads = random_grads(rng, params)
        if i == 1:
            grads["w"][rng.integers(3), rng.integers(2)] = np.inf
        if path == "update":
            uf, sf = opt.update(grads, sf, pf)
            ul, sl = opt.update(grads, sl, pl)
            pf, pl = optim.apply_updates(pf, uf), optim.apply_updates(pl, ul)
        else:
            pf, sf = optim.update_and_apply(opt, grads, sf, pf)
            pl, sl = optim.update_and_apply(opt, grads, sl, pl)
        leaves_equal((pf, sf), (pl, sl))
        assert ff.tree.structure(sl) == ff.tree.structure(loaded)  # the loaded classes
    assert float(sl.scale) == 2.0 ** 15  # halved once, doubled after two good steps
    assert not np.array_equal(pl["w"], params["w"])


class CountState(NamedTuple):
    count: Any


def scale_by_count():
    """A user's transform: it builds its own state class, whatever the given one."""
    def init(params):
        return CountState(np.zeros((), np.int32))

    def update(updates, state, params=None):
        f = np.float32(1.0) / (state.count + 1).astype(np.float32)
        return ff.tree.map(lambda g: g * f, updates), CountState(state.count + 1)

    return optim.GradientTransformation(init, update)


def test_loss_scaling_keeps_loaded_classes_around_a_users_transform(rng, tmp_path):
    """The inner update returns its own class for a loaded state: the wrapper still keeps
    the step (or the old state) in the loaded structure."""
    opt = mp.dynamic_loss_scaling(optim.chain(scale_by_count(), optim.sgd(0.1)))
    params = random_params(rng)
    fresh = opt.init(params)
    loaded = reload(tmp_path, fresh)
    for inf in (False, True):
        grads = random_grads(rng, params)
        if inf:
            grads["b"][0] = np.nan
        pf, fresh = optim.update_and_apply(opt, grads, fresh, params)
        pl, loaded = optim.update_and_apply(opt, grads, loaded, params)
        leaves_equal((pf, fresh), (pl, loaded))
        assert type(loaded.inner[0]).__module__ == "fuseflow.checkpoint"
    assert int(loaded.inner[0].count) == 1  # the NaN step was skipped


@pytest.mark.parametrize("wrapped", [False, True])
def test_compile_steps_a_state_loaded_without_like(rng, tmp_path, wrapped):
    """A non-fused chain (and the same inside dynamic_loss_scaling) under ff.compile with a
    loaded state: it raised CompileError "output 1 must have the structure of argument 1"."""
    opt = INNER["clip_adam"]()
    opt = mp.dynamic_loss_scaling(opt) if wrapped else opt
    params = random_params(rng)
    loaded = reload(tmp_path, opt.init(params))

    def step(params, state, grads):
        params, state = optim.update_and_apply(opt, grads, state, params)
        return params, state, {}

    compiled = ff.compile(step)
    pe, se, pc, sc = params, opt.init(params), params, loaded
    for _ in range(3):
        grads = random_grads(rng, params)
        pe, se, _ = step(pe, se, grads)
        pc, sc, _ = compiled(pc, sc, grads)
    leaves_equal((pe, se), (pc, sc))
    assert ff.tree.structure(sc) == ff.tree.structure(loaded)


def test_compile_names_the_classes_when_only_they_differ(rng, tmp_path):
    """The structures print alike: the error says the classes differ and gives the fix."""
    params = random_params(rng)
    loaded = reload(tmp_path, CountState(np.asarray(rng.integers(9), np.int32)))

    def step(params, state, x):
        return params, CountState(state.count + 1), {}

    with pytest.raises(ff.CompileError) as err:
        ff.compile(step)(params, loaded, rng.standard_normal(3))
    msg = str(err.value)
    assert "the classes differ" in msg
    assert f"{__name__}.CountState returned for fuseflow.checkpoint.CountState given" in msg
    assert "Fix: ff.checkpoint.load(path, like=opt.init(params))" in msg


def test_loss_scaling_refuses_an_inner_state_of_another_structure(rng):
    """The loaded classes are matched by their printed structure; anything else differs."""
    def grows():
        def update(updates, state, params=None):
            return updates, (*state, np.zeros(()))
        return optim.GradientTransformation(lambda p: (), update)

    opt = mp.dynamic_loss_scaling(grows())
    params = random_params(rng)
    with pytest.raises(ValueError, match=r"dynamic_loss_scaling: the inner optimizer's update "
                                         r"returned a state of structure .*\(\*,\).* not that "
                                         r"of its input"):
        opt.update(random_grads(rng, params), opt.init(params), params)


# ---- 2. the loss-scale rule's arguments ----------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"init_scale": float("inf")}, ValueError, "init_scale must be a finite number, got inf"),
    ({"init_scale": -1}, ValueError, r"init_scale must be in \[1.0, .*got -1"),
    ({"init_scale": 0}, ValueError, r"init_scale must be in \[1.0, .*got 0"),
    ({"init_scale": 4.0, "min_scale": 8.0}, ValueError, r"init_scale must be in \[8.0, "),
    ({"init_scale": "big"}, TypeError, "init_scale must be a number, got str 'big'"),
    ({"growth_interval": 0}, ValueError, "growth_interval must be >= 1, got 0"),
    ({"growth_interval": 2.5}, TypeError, "growth_interval must be an int"),
    ({"growth_factor": 0.5}, ValueError, r"growth_factor must be > 1.0, got 0.5"),
    ({"growth_factor": 1.0}, ValueError, r"growth_factor must be > 1.0, got 1.0"),
    ({"backoff_factor": 2.0}, ValueError, r"backoff_factor must be in \(0.0, 1.0\), got 2.0"),
    ({"backoff_factor": 0}, ValueError, r"backoff_factor must be in \(0.0, 1.0\), got 0"),
    ({"min_scale": float("nan")}, ValueError, "min_scale must be a finite number"),
    ({"min_scale": 0.0}, ValueError, r"min_scale must be > 0.0, got 0.0"),
])
def test_loss_scale_rule_is_checked_when_built(kwargs, error, match):
    with pytest.raises(error, match=f"dynamic_loss_scaling: {match}.*Fix: dynamic_loss_scaling"):
        mp.dynamic_loss_scaling(optim.adam(1e-3), **kwargs)


def test_loss_scale_rule_takes_good_values(rng):
    init = float(2 ** rng.integers(1, 20))
    opt = mp.dynamic_loss_scaling(optim.sgd(0.1), init_scale=init, growth_interval=10 ** 12,
                                  growth_factor=3, backoff_factor=0.25, min_scale=0.5)
    assert float(opt.init(random_params(rng)).scale) == init


# ---- 3. gradients wider than the optimizer's state -----------------------------------

@pytest.mark.parametrize("path", ["update", "update_and_apply"])
@pytest.mark.parametrize("name, where, kept", [
    ("adam", "scale_by_adam.update", "moments"), ("momentum", "trace.update", "momentum"),
    ("adamw", "scale_by_adam.update", "moments")])
def test_wider_grads_are_refused_by_a_state_like_the_params(rng, name, where, kept, path):
    """float64 grads for float32 params turned Adam's moments into float64 silently."""
    opt = {"adam": optim.adam(1e-3), "momentum": optim.sgd(0.1, momentum=0.9),
           "adamw": optim.adamw(1e-3)}[name]
    params = random_params(rng)
    grads = random_grads(rng, params, np.float64)
    with pytest.raises(TypeError) as err:
        if path == "update":
            opt.update(grads, opt.init(params), params)
        else:
            optim.update_and_apply(opt, grads, opt.init(params), params)
    msg = str(err.value)
    assert msg.startswith(f"{where}: the update at 'b' has dtype float64, but the {kept}")
    assert "there are float32: they would become float64" in msg
    assert "Fix: pass gradients in the params' dtype, e.g. g.astype('float32')" in msg


@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_narrower_grads_are_computed_in_the_state_dtype(rng, tmp_path, name):
    """float16 grads for float32 params (mixed precision's): the step of the same grads
    cast up, bit for bit (Adam squared them in float16: inf above 256); the state still
    loads with like=opt.init(params)."""
    opt = optim.adam(1e-3) if name == "adam" else optim.sgd(0.1, momentum=0.9)
    params = random_params(rng)
    grads = ff.tree.map(lambda g: g * 300, random_grads(rng, params, np.float16))
    up = ff.tree.map(lambda g: g.astype(np.float32), grads)
    u16, s16 = opt.update(grads, opt.init(params), params)
    u32, s32 = opt.update(up, opt.init(params), params)
    assert_trees_equal((u16, s16), (u32, s32))
    floats = [a for a in ff.tree.leaves((u16, s16)) if a.dtype.kind == "f"]
    assert {a.dtype for a in floats} == {np.dtype(np.float32)}
    assert all(np.isfinite(a).all() for a in floats)
    ff.checkpoint.save(tmp_path / "s.safetensors", s16)
    assert_trees_equal(ff.checkpoint.load(tmp_path / "s.safetensors", like=opt.init(params)),
                       s16)


def test_narrower_grads_in_the_fused_numpy_step(rng):
    opt = optim.adam(1e-3)
    params = random_params(rng)
    grads = random_grads(rng, params, np.float16)
    _, state = optim.update_and_apply(opt, grads, opt.init(params), params)
    assert {a.dtype for a in ff.tree.leaves(state[0].mu)} == {np.dtype(np.float32)}


def test_stateless_sgd_still_takes_float64_grads(rng):
    """No state to widen: plain SGD's params keep their dtype."""
    params = random_params(rng)
    grads = random_grads(rng, params, np.float64)
    new, _ = optim.update_and_apply(optim.sgd(0.1), grads, optim.sgd(0.1).init(params), params)
    for p, g, n in zip(ff.tree.leaves(params), ff.tree.leaves(grads), ff.tree.leaves(new)):
        assert n.dtype == np.float32
        np.testing.assert_allclose(n, p - 0.1 * g, rtol=1e-6)


# ---- 4. ff.compile on NumPy, donate_argnums ------------------------------------------

def make_step(opt, widen_at=None):
    """A step that returns float64 params when the batch has ``widen_at`` rows."""
    def step(params, state, x):
        grads = ff.tree.map(lambda p: (p * x.mean()).astype(p.dtype), params)
        params, state = optim.update_and_apply(opt, grads, state, params)
        if x.shape[0] == widen_at:
            params = ff.tree.map(lambda p: p.astype(np.float64), params)
        return params, state, {"n": x.shape[0]}
    return step


def test_compile_on_numpy_checks_each_new_signature_once(rng, monkeypatch):
    """A smaller last batch whose step returns float64 params passed on the CPU (only the
    first call was checked) and would raise on a GPU; each signature is checked once."""
    checks = []
    check = ff.CompiledStep._check_outputs
    monkeypatch.setattr(ff.CompiledStep, "_check_outputs",
                        lambda self, out, args: checks.append(1) or check(self, out, args))
    opt = optim.adam(1e-3)
    params = random_params(rng)
    state = opt.init(params)
    compiled = ff.compile(make_step(opt, widen_at=5))
    for _ in range(3):
        params, state, _ = compiled(params, state, rng.standard_normal((8, 3)))
    assert len(checks) == 1
    with pytest.raises(ff.CompileError, match=r"output 0 at 'b' is \(2,\) float64 but the "
                                              r"donated input there is \(2,\) float32"):
        compiled(params, state, rng.standard_normal((5, 3)))
    compiled(params, state, rng.standard_normal((7, 3)))
    assert len(checks) == 3


def test_compile_docs_say_what_holds_for_donated_inputs_on_numpy(rng):
    """On NumPy new arrays come back and the inputs keep their values; the docs said "the
    params you passed in are the params you get back", true only on the GPU."""
    opt = optim.sgd(0.1, momentum=0.9)
    params = random_params(rng)
    state = opt.init(params)
    before = ff.tree.map(np.copy, (params, state))
    new_params, new_state, _ = ff.compile(make_step(opt))(params, state,
                                                          rng.standard_normal((4, 3)))
    assert_trees_equal((params, state), before)
    assert not np.array_equal(new_params["w"], params["w"])
    doc = " ".join((Path(__file__).parent.parent / "docs" / "compile.md").read_text().split())
    assert "the params you passed in are the params you get back" not in doc
    assert "on NumPy the step returns new arrays and the inputs keep their old values" in doc
    assert "Use only the returned values after a call" in doc


def test_compile_takes_an_int_donate_argnums(rng):
    """``donate_argnums=0`` raised "'int' object is not iterable"; jax.jit takes it."""
    def step(params, x):
        return ff.tree.map(lambda p: p * x, params), {}

    compiled = ff.compile(step, donate_argnums=0)
    assert compiled.donate == (0,)
    params = random_params(rng)
    x = np.float32(rng.standard_normal())
    out, _ = compiled(params, x)
    assert_trees_equal(out, ff.tree.map(lambda p: p * x, params))


@pytest.mark.parametrize("bad", [None, "0", (0, 0), -1, (True,), (0, 1.0)])
def test_compile_refuses_bad_donate_argnums(bad):
    with pytest.raises(TypeError, match=r"compile: donate_argnums must be an argument index "
                                        r"or a tuple of distinct ones, got .*Fix: "):
        ff.compile(lambda p, s: (p, s), donate_argnums=bad)


# ---- 5. 8-bit floats (bfloat16 is a compute dtype: test_bfloat16.py) -----------------

def test_float8_gets_the_mixed_precision_message():
    model = nn.Serial(nn.Dense(3))
    bad = "float8_e4m3fn"
    for call in (lambda: mp.value_and_grad(model, ff.losses.softmax_cross_entropy, bad),
                 lambda: mp.dynamic_loss_scaling(optim.adam(1e-3), compute_dtype=bad)):
        with pytest.raises(ValueError, match=r"compute dtype must be one of \['bfloat16', "
                           r"'float16', 'float32', 'float64'\], got float8_e4m3fn. "
                           r"Fix: compute_dtype='bfloat16' or 'float16'"):
            call()


# ---- 6. empty trees ------------------------------------------------------------------

def test_all_finite_of_nothing_is_true(rng):
    assert mp.all_finite({}) is not None and bool(mp.all_finite({}))
    assert bool(mp.all_finite([(), {}]))
    params = random_params(rng)
    params["w"][rng.integers(3), rng.integers(2)] = -np.inf
    assert not bool(mp.all_finite(params))


@pytest.mark.parametrize("compute_dtype", [None, "float16"])
def test_loss_scaling_of_an_empty_tree(compute_dtype):
    """As the plain optimizers: init, update and update_and_apply of no params."""
    opt = mp.dynamic_loss_scaling(optim.adam(1e-3), compute_dtype=compute_dtype)
    state = opt.init({})
    assert float(state.scale) == 2.0 ** 15 and int(state.good_steps) == 0
    updates, state = opt.update({}, state, {})
    assert updates == {} and int(state.good_steps) == 1
    params, state = optim.update_and_apply(opt, {}, state, {})
    assert params == {} and int(state.good_steps) == 2 and int(state.inner[0].count) == 2


def test_loss_scale_growth_stops_short_of_inf():
    """A long run of finite steps grows the scale only while it stays finite (as PyTorch's
    GradScaler): an inf scale would skip every later step."""
    from fuseflow import mixed_precision as mp

    opt = mp.dynamic_loss_scaling(optim.sgd(0.1), init_scale=3e38, growth_interval=1)
    params = {"w": np.ones(2, np.float32)}
    state = opt.init(params)
    for _ in range(3):
        _, state = opt.update({"w": np.full(2, 0.5, np.float32)}, state, params)
    assert np.float32(state.scale) == np.float32(3e38) and int(state.good_steps) == 0


def test_no_compute_dtype_is_not_float64_and_unscale_of_nothing():
    from fuseflow import mixed_precision as mp

    model = ff.nn.Serial(ff.nn.Dense(3))
    with pytest.raises(ValueError, match="got None"):
        mp.value_and_grad(model, ff.losses.softmax_cross_entropy, None)
    assert mp.unscale({}, {}, 8.0) == {}
