"""fuseflow.optim against optax (the reference, test-only): every optimizer and every
schedule, step by step on one random problem; plus dtypes, errors and convergence."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fuseflow import optim, tree

STEPS = 100
RTOL, ATOL = 1e-6, 1e-7  # params are O(1); ATOL only covers entries that pass near zero


def make_params(seed=0, dtype=np.float32):
    """Nested dict/list of leaves of several shapes, a 0-d one included."""
    rng = np.random.default_rng(seed)
    shapes = {"layers": [{"w": (5, 3), "b": (3,)}, {"w": (3, 2), "b": (2,)}], "scale": ()}
    return tree.map(lambda s: rng.standard_normal(s).astype(dtype), shapes,
                    is_leaf=lambda s: isinstance(s, tuple))


def make_grad_fn(params, seed=1):
    """grads = a * (p - target) + noise_t: a random quadratic plus a fixed random
    perturbation per step, computed the same way in NumPy for both libraries."""
    rng = np.random.default_rng(seed)
    like = lambda f: tree.map(lambda p: f(p.shape).astype(p.dtype), params)
    curv, target = like(lambda s: rng.uniform(0.5, 2.0, s)), like(rng.standard_normal)
    noise = [like(lambda s: 0.3 * rng.standard_normal(s)) for _ in range(STEPS)]

    def grad_fn(p, t):
        return tree.map(lambda p, a, c, n: a * (np.asarray(p) - c) + n, p, curv, target,
                        noise[t])

    return grad_fn


def run_ours(opt, params, grad_fn, steps=STEPS):
    state = opt.init(params)
    for t in range(steps):
        updates, state = opt.update(grad_fn(params, t), state, params)
        params = optim.apply_updates(params, updates)
    return params, state


def run_optax(opt, params, grad_fn, steps=STEPS):
    params = tree.map(jnp.asarray, params)
    state = opt.init(params)
    for t in range(steps):
        grads = tree.map(jnp.asarray, grad_fn(params, t))
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return tree.map(np.asarray, params)


def decay_matrices(p):
    return tree.map(lambda x: x.ndim > 1, p)


MASK_TREE = decay_matrices(make_params())

# name -> (ours, optax's), each schedule built with the same arguments.
SCHEDULES = {
    "constant": (optim.constant_schedule(0.03), optax.constant_schedule(0.03)),
    "linear": (optim.linear_schedule(0.05, 0.001, 50, transition_begin=10),
               optax.linear_schedule(0.05, 0.001, 50, transition_begin=10)),
    "cosine": (optim.cosine_decay_schedule(0.05, 60, alpha=0.1),
               optax.cosine_decay_schedule(0.05, 60, alpha=0.1)),
    "warmup_cosine": (optim.warmup_cosine_decay_schedule(0.0, 0.05, 10, 80, end_value=0.001),
                      optax.warmup_cosine_decay_schedule(0.0, 0.05, 10, 80, end_value=0.001)),
    "warmup0_cosine": (optim.warmup_cosine_decay_schedule(0.0, 0.05, 0, 80),
                       optax.warmup_cosine_decay_schedule(0.0, 0.05, 0, 80)),
    "step_decay": (optim.step_decay_schedule(0.05, 25, 0.5),
                   optax.exponential_decay(0.05, 25, 0.5, staircase=True)),
}

# name -> (ours, optax's) optimizer factories.
OPTIMIZERS = {
    "sgd": (lambda: optim.sgd(0.05), lambda: optax.sgd(0.05)),
    "sgd_momentum": (lambda: optim.sgd(0.05, momentum=0.9),
                     lambda: optax.sgd(0.05, momentum=0.9)),
    "sgd_nesterov": (lambda: optim.sgd(0.05, momentum=0.9, nesterov=True),
                     lambda: optax.sgd(0.05, momentum=0.9, nesterov=True)),
    "adam": (lambda: optim.adam(0.02), lambda: optax.adam(0.02)),
    "adam_betas": (lambda: optim.adam(0.02, b1=0.5, b2=0.9, eps=1e-6),
                   lambda: optax.adam(0.02, b1=0.5, b2=0.9, eps=1e-6)),
    "adamw": (lambda: optim.adamw(0.02, weight_decay=0.1),
              lambda: optax.adamw(0.02, weight_decay=0.1)),
    "adamw_mask_tree": (lambda: optim.adamw(0.02, weight_decay=0.1, mask=MASK_TREE),
                        lambda: optax.adamw(0.02, weight_decay=0.1, mask=MASK_TREE)),
    "adamw_mask_callable": (lambda: optim.adamw(0.02, weight_decay=0.1, mask=decay_matrices),
                            lambda: optax.adamw(0.02, weight_decay=0.1, mask=decay_matrices)),
    "clip_adam": (lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adam(0.02)),
                  lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.02))),
    "clip_sgd_momentum": (lambda: optim.chain(optim.clip_by_global_norm(1.0),
                                              optim.sgd(0.05, momentum=0.9)),
                          lambda: optax.chain(optax.clip_by_global_norm(1.0),
                                              optax.sgd(0.05, momentum=0.9))),
}
for _name, (_ours, _ref) in SCHEDULES.items():
    OPTIMIZERS[f"sgd_{_name}"] = (lambda s=_ours: optim.sgd(s), lambda s=_ref: optax.sgd(s))
    OPTIMIZERS[f"adam_{_name}"] = (lambda s=_ours: optim.adam(s), lambda s=_ref: optax.adam(s))
OPTIMIZERS["adamw_mask_cosine"] = (
    lambda: optim.adamw(SCHEDULES["cosine"][0], weight_decay=0.1, mask=decay_matrices),
    lambda: optax.adamw(SCHEDULES["cosine"][1], weight_decay=0.1, mask=decay_matrices))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_matches_optax_for_100_steps(name):
    ours, ref = OPTIMIZERS[name]
    params = make_params()
    grad_fn = make_grad_fn(params)
    got, _ = run_ours(ours(), params, grad_fn)
    want = run_optax(ref(), params, grad_fn)
    assert tree.structure(got) == tree.structure(want)
    for path, g, w in zip(tree.paths(want), tree.leaves(got), tree.leaves(want)):
        assert g.dtype == np.float32, path
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {path}")
    # The problem must move the params, or agreement proves nothing.
    moved = max(np.abs(g - p).max() for g, p in zip(tree.leaves(got), tree.leaves(params)))
    assert moved > 0.1


def test_clipping_is_active_in_the_comparison():
    """clip_adam above compares something only if the grads exceed max_norm (1.0)."""
    params = make_params()
    grad_fn = make_grad_fn(params)
    norms = []
    opt = optim.adam(0.02)
    state = opt.init(params)
    for t in range(STEPS):
        grads = grad_fn(params, t)
        norms.append(float(tree.l2_norm(grads)))
        updates, state = opt.update(grads, state, params)
        params = optim.apply_updates(params, updates)
    assert sum(n > 1.0 for n in norms) > STEPS // 2, norms


def test_clip_by_global_norm_values():
    clip = optim.clip_by_global_norm(5.0)
    big = {"a": np.array([3.0, 4.0], np.float32), "b": np.array([12.0], np.float32)}  # norm 13
    out, _ = clip.update(big, clip.init(big))
    np.testing.assert_allclose(tree.l2_norm(out), 5.0, rtol=1e-6)
    np.testing.assert_allclose(out["a"], big["a"] * 5 / 13, rtol=1e-6)
    assert out["a"].dtype == np.float32
    small = tree.scale(big, 0.1)
    assert all(np.array_equal(x, y) for x, y in zip(tree.leaves(clip.update(small, ())[0]),
                                                    tree.leaves(small)))
    zero = tree.zeros_like(big)
    assert not np.isnan(tree.leaves(clip.update(zero, ())[0])[0]).any()


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_matches_optax_pointwise(name):
    ours, ref = SCHEDULES[name]
    for count in [*range(150), 1000, 10**6, np.iinfo(np.int32).max]:
        want = float(ref(jnp.asarray(count, jnp.int32)))
        got_array = ours(np.asarray(count, np.int32))  # as from the optimizer state
        got_int = ours(count)
        np.testing.assert_allclose(float(got_array), want, rtol=1e-6, atol=1e-9,
                                   err_msg=f"{name} at count {count}")
        np.testing.assert_allclose(float(got_int), float(got_array), rtol=1e-12)


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam", "adamw_mask_tree",
                                  "clip_adam", "sgd_cosine", "adam_warmup_cosine"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_is_arrays_and_keeps_dtype(name, dtype):
    params = make_params(dtype=dtype)
    opt = OPTIMIZERS[name][0]()
    state = opt.init(params)
    grads = make_grad_fn(params)(params, 0)
    updates, state = opt.update(grads, state, params)
    updates, state = opt.update(grads, state, params)
    for u in tree.leaves(updates):
        assert u.dtype == dtype
    new_params = optim.apply_updates(params, updates)
    for p in tree.leaves(new_params):
        assert isinstance(p, np.ndarray) and p.dtype == dtype
    for leaf in tree.leaves(state):
        assert hasattr(leaf, "dtype") and leaf.dtype in (dtype, np.int32), (name, leaf)
        if leaf.dtype == np.int32:
            assert isinstance(leaf, np.ndarray) and leaf.shape == () and leaf == 2


def test_count_saturates_instead_of_wrapping():
    opt = optim.adam(1e-3)
    params = {"w": np.ones(3, np.float32)}
    state = opt.init(params)
    top = np.asarray(np.iinfo(np.int32).max, np.int32)
    state = (state[0]._replace(count=top), state[1])
    _, state = opt.update(params, state, params)
    assert state[0].count == top


def test_no_optax_or_jax_at_run_time():
    code = ("import sys, fuseflow.optim; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('optax', 'jax')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- convergence: each optimizer minimises a quadratic on its own ----

CONVERGING = {  # every optimizer and schedule, with settings that reach the minimum
    "sgd": lambda: optim.sgd(0.1),
    "sgd_momentum": lambda: optim.sgd(0.05, momentum=0.9),
    "sgd_nesterov": lambda: optim.sgd(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: optim.adam(0.03),
    "adamw": lambda: optim.adamw(0.03, weight_decay=1e-4),
    "adamw_mask": lambda: optim.adamw(0.03, weight_decay=1e-4, mask=decay_matrices),
    "clip_adam": lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adam(0.03)),
    "sgd_constant": lambda: optim.sgd(optim.constant_schedule(0.1)),
    "sgd_linear": lambda: optim.sgd(optim.linear_schedule(0.2, 0.05, 200)),
    "adam_cosine": lambda: optim.adam(optim.cosine_decay_schedule(0.05, 300)),
    "adam_warmup_cosine": lambda: optim.adam(
        optim.warmup_cosine_decay_schedule(0.0, 0.05, 20, 300)),
    "adam_step_decay": lambda: optim.adam(optim.step_decay_schedule(0.05, 100, 0.5)),
}


@pytest.mark.parametrize("name", CONVERGING)
def test_minimises_a_quadratic(name):
    params = make_params(seed=3)
    rng = np.random.default_rng(4)
    target = tree.map(lambda p: rng.standard_normal(p.shape).astype(p.dtype), params)

    def loss(p):
        return 0.5 * float(tree.vdot(tree.sub(p, target), tree.sub(p, target)))

    final, _ = run_ours(CONVERGING[name](), params, lambda p, t: tree.sub(p, target),
                        steps=300)
    assert loss(final) < 1e-3 * loss(params), (loss(params), loss(final))


# ---- errors: one test per bad input ----

@pytest.mark.parametrize("make", [optim.sgd, optim.adam, optim.adamw], ids=lambda f: f.__name__)
def test_lr_of_wrong_type(make):
    with pytest.raises(TypeError, match=rf"{make.__name__}: lr must be a float or a schedule "
                                        r".*got str 'fast'.*Fix: "):
        make("fast")


@pytest.mark.parametrize("make", [optim.sgd, optim.adam, optim.adamw], ids=lambda f: f.__name__)
def test_negative_lr(make):
    with pytest.raises(ValueError, match=rf"{make.__name__}: lr must be >= 0, got -0.001.*Fix"):
        make(-1e-3)


@pytest.mark.parametrize("make", [optim.adam, optim.adamw], ids=lambda f: f.__name__)
@pytest.mark.parametrize("arg", [{"b1": 1.0}, {"b1": -0.1}, {"b2": 1.0}, {"b2": 1.5}])
def test_beta_outside_unit_interval(make, arg):
    (name, value), = arg.items()
    with pytest.raises(ValueError, match=rf"{make.__name__}: {name} must be in \[0.0, 1.0\), "
                                         rf"got {value}\. Fix: "):
        make(1e-3, **arg)


@pytest.mark.parametrize("eps", [0.0, -1e-8])
def test_eps_not_positive(eps):
    with pytest.raises(ValueError, match=rf"adam: eps must be > 0.0, got {eps}\. Fix: "):
        optim.adam(1e-3, eps=eps)


@pytest.mark.parametrize("max_norm", [0.0, -1.0])
def test_max_norm_not_positive(max_norm):
    with pytest.raises(ValueError, match=rf"clip_by_global_norm: max_norm must be > 0.0, got "
                                         rf"{max_norm}\. Fix: clip_by_global_norm"):
        optim.clip_by_global_norm(max_norm)


def test_momentum_outside_unit_interval():
    with pytest.raises(ValueError, match=r"sgd: momentum must be in \[0.0, 1.0\), got 1.0"):
        optim.sgd(0.1, momentum=1.0)


def test_nesterov_without_momentum():
    with pytest.raises(ValueError, match="sgd: nesterov=True needs momentum > 0"):
        optim.sgd(0.1, nesterov=True)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw"])
def test_update_with_grads_of_another_structure(name):
    params = make_params()
    opt = OPTIMIZERS[name][0]()
    state = opt.init(params)
    grads = {"layers": params["layers"][:1], "scale": params["scale"]}  # one layer short
    with pytest.raises(ValueError, match="structure") as err:
        opt.update(grads, state, params)
    assert str(tree.structure(grads)) in str(err.value)
    assert str(tree.structure(params)) in str(err.value)


def test_update_with_grads_of_another_shape():
    params = make_params()
    opt = optim.adam(1e-3)
    state = opt.init(params)
    grads = tree.map(lambda p: p, params)
    grads["layers"][0]["w"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match=r"at 'layers/0/w' has shape \(3, 5\).* \(5, 3\)"):
        opt.update(grads, state, params)


def test_apply_updates_of_another_structure():
    params = make_params()
    updates = {"layers": params["layers"]}
    with pytest.raises(ValueError, match=r"apply_updates: the updates have structure"):
        optim.apply_updates(params, updates)


@pytest.mark.parametrize("mask", [
    {"layers": [True, False], "bias": True},  # wrong key
    {"layers": [True], "scale": False},  # list too short
    lambda p: {"layers": True},  # a callable that builds the wrong tree
], ids=["key", "length", "callable"])
def test_mask_not_matching_params(mask):
    params = make_params()
    opt = optim.adamw(1e-3, mask=mask)
    with pytest.raises(ValueError, match=r"add_decayed_weights: the mask has structure .*"
                                         r"params' structure .*Fix: "):
        opt.init(params)


def test_mask_of_non_bools():
    params = make_params()
    with pytest.raises(TypeError, match="mask leaves must be bools"):
        optim.adamw(1e-3, mask=tree.map(lambda p: p.ndim, params)).init(params)


def test_mask_prefix_is_broadcast():
    params = make_params()
    opt = optim.add_decayed_weights(0.5, mask={"layers": True, "scale": False})
    out, _ = opt.update(tree.zeros_like(params), opt.init(params), params)
    np.testing.assert_array_equal(out["layers"][1]["w"], 0.5 * params["layers"][1]["w"])
    assert out["scale"] == 0


@pytest.mark.parametrize("ordered_params", [True, False], ids=["ordered_params", "ordered_mask"])
def test_mask_meets_its_leaf_by_key_across_mapping_orders(ordered_params):
    """A dict mask over OrderedDict params (or the other way round) flattens in another key
    order; each flag must still reach its own leaf, in the reference and the fused update."""
    from collections import OrderedDict

    rng = np.random.default_rng(3)
    items = [("b", rng.standard_normal(2)), ("a", rng.standard_normal(3))]
    flags = [("b", False), ("a", True)]
    params = OrderedDict(items) if ordered_params else dict(items)
    mask = dict(flags) if ordered_params else OrderedDict(flags)
    out, _ = optim.add_decayed_weights(0.5, mask=mask).update(
        tree.zeros_like(params), optim.EmptyState(), params)
    np.testing.assert_array_equal(out["a"], 0.5 * params["a"])
    np.testing.assert_array_equal(out["b"], np.zeros(2))

    opt = optim.adamw(1e-3, weight_decay=0.5, mask=mask)
    grads = tree.map(lambda p: rng.standard_normal(p.shape), params)
    ref = optim.apply_updates(params, opt.update(grads, opt.init(params), params)[0])
    fused, _ = optim.update_and_apply(opt, grads, opt.init(params), params)
    expected = optax.adamw(1e-3, weight_decay=0.5, mask={"a": True, "b": False})
    upd, _ = expected.update(dict(grads), expected.init(dict(params)), dict(params))
    for k in ("a", "b"):
        np.testing.assert_allclose(ref[k], params[k] + np.asarray(upd[k]), rtol=1e-6)
        np.testing.assert_array_equal(fused[k], ref[k])


def test_weight_decay_needs_params():
    opt = optim.adamw(1e-3)
    params = make_params()
    with pytest.raises(ValueError, match=r"add_decayed_weights needs the params"):
        opt.update(params, opt.init(params))


def test_chain_of_non_transforms():
    with pytest.raises(TypeError, match=r"chain: argument 0 is function .*Fix: call the"):
        optim.chain(optim.clip_by_global_norm, optim.adam(1e-3))


@pytest.mark.parametrize("make, match", [
    (lambda: optim.cosine_decay_schedule(0.1, 0), "decay_steps must be >= 1, got 0"),
    (lambda: optim.cosine_decay_schedule(0.1, 10.5), "decay_steps must be an int"),
    (lambda: optim.warmup_cosine_decay_schedule(0, 0.1, 100, 100), "must exceed warmup_steps"),
    (lambda: optim.step_decay_schedule(0.1, 0, 0.5), "step_size must be >= 1"),
    (lambda: optim.step_decay_schedule(0.1, 10, 0.0), r"decay_rate must be > 0.0"),
    (lambda: optim.linear_schedule(0.1, 0.0, -5), "transition_steps must be >= 1"),
], ids=["cosine_steps", "cosine_float_steps", "warmup_too_long", "step_size", "decay_rate",
        "linear_steps"])
def test_bad_schedule_arguments(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        make()


# ---- the same code on CuPy arrays ----

@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:cupyx.allow_synchronize")  # deprecated, still catches .item()
@pytest.mark.parametrize("name", ["sgd_nesterov", "adam_warmup_cosine", "adamw_mask_callable",
                                  "clip_adam", "sgd_step_decay"])
def test_cupy_matches_numpy(name):
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as e:  # CuPy without a driver or device
        pytest.skip(f"no usable CUDA device: {e}")
    import cupyx

    params = make_params()
    grad_fn = make_grad_fn(params)
    want, _ = run_ours(OPTIMIZERS[name][0](), params, grad_fn)
    on_gpu = lambda t: tree.map(cp.asarray, t)
    opt = OPTIMIZERS[name][0]()
    p = on_gpu(params)
    state = opt.init(p)
    p_host = params
    for t in range(STEPS):
        g = on_gpu(grad_fn(p_host, t))
        with cupyx.allow_synchronize(False):  # the update never waits for the device
            updates, state = opt.update(g, state, p)
            p = optim.apply_updates(p, updates)
        p_host = tree.map(cp.asnumpy, p)
    for leaf in tree.leaves(state):
        assert isinstance(leaf, cp.ndarray) and leaf.dtype in (cp.float32, cp.int32)
    for g, w in zip(tree.leaves(p_host), tree.leaves(want)):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_adam_on_bfloat16_params_is_optax_and_trains():
    """Params and moments all in bfloat16: Adam's bias corrections are formed in float32
    and rounded, as optax forms them (bfloat16's 0.999 is 1.0, so in bfloat16 itself
    1 - 0.999**t would be 0 and every update 0). Three updates equal optax's bit for bit,
    and 30 steps of an MLP bring its loss down (test_bfloat16.py holds the rest of
    bfloat16; this one sits here, with optax, whose JAX must not be imported before the
    CLI tests fork)."""
    import jax

    import fuseflow as ff

    bf16 = ff.bfloat16
    model = ff.nn.Serial(ff.nn.Dense(64, "relu"), ff.nn.Dense(48, "gelu"), ff.nn.Dense(10))
    _, params = model.init(ff.random.key(6), (32,))
    params = ff.tree.astype(params, bf16)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((16, 32)).astype(bf16), np.arange(16) % 10
    opt, ox = ff.optim.adam(1e-2), optax.adam(1e-2)
    state, ostate = opt.init(params), ox.init(jax.tree.map(jnp.asarray, params))
    for _ in range(3):
        grads = ff.tree.map(lambda p: (rng.standard_normal(p.shape) * 0.1).astype(bf16),
                            params)
        updates, state = opt.update(grads, state, params)
        oupdates, ostate = ox.update(jax.tree.map(jnp.asarray, grads), ostate)
        for a, b in zip(ff.tree.leaves(updates), jax.tree.leaves(oupdates)):
            assert a.dtype == bf16
            np.testing.assert_array_equal(a.view(np.uint16), np.asarray(b).view(np.uint16))
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt)
    state = opt.init(params)
    losses = []
    for _ in range(30):
        params, state, metrics = step(params, state, x, y)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses
