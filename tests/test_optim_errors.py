"""Bad optimizer input gets an error that names the optimizer (or function), what was
expected, what came, and the fix: ``update_and_apply`` (the fused step) as ``opt.update``
then ``apply_updates`` (the reference), non-finite hyperparameters, negative schedules.

The models, values and shapes are drawn fresh each run; a failure's captured output shows
the seed (``FUSEFLOW_TEST_SEED=<seed>`` in the environment repeats it).
"""

import math
import re

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision, nn

OPTIMIZERS = {
    "sgd": lambda: ff.optim.sgd(0.1),
    "sgd_schedule": lambda: ff.optim.sgd(ff.optim.cosine_decay_schedule(0.1, 50)),
    "momentum": lambda: ff.optim.sgd(0.05, momentum=0.9),
    "nesterov": lambda: ff.optim.sgd(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: ff.optim.adam(1e-3),
    "adam_schedule": lambda: ff.optim.adam(ff.optim.warmup_cosine_decay_schedule(0, 1e-3, 5, 50)),
    "adamw": lambda: ff.optim.adamw(1e-3, weight_decay=0.1),
    "adamw_masked": lambda: ff.optim.adamw(
        1e-3, mask=lambda p: ff.tree.map(lambda a: a.ndim > 1, p)),
}
#: optimizers whose state holds arrays like the params (a momentum buffer or moments)
WITH_BUFFERS = ["momentum", "nesterov", "adam", "adam_schedule", "adamw", "adamw_masked"]


def random_model(rng, hidden=None):
    """An MLP of 2 or 3 Dense layers with random widths, and its params (random too)."""
    widths = [int(w) for w in rng.integers(2, 24, size=int(rng.integers(1, 3)))]
    if hidden is not None:
        widths[0] = hidden
    layers = [nn.Dense(w, "relu") for w in widths] + [nn.Dense(int(rng.integers(2, 11)))]
    model = nn.Serial(*layers)
    _, params = model.init(ff.random.key(int(rng.integers(2 ** 31))), (int(rng.integers(3, 40)),))
    return model, params


def random_grads(rng, params):
    return ff.tree.map(lambda p: rng.standard_normal(p.shape).astype(p.dtype), params)


def fused_error(opt, grads, state, params):
    """The exception of ``update_and_apply``; the params must come out untouched."""
    before = ff.tree.map(np.copy, params)
    with pytest.raises((TypeError, ValueError)) as err:
        ff.optim.update_and_apply(opt, grads, state, params, donate_grads=True)
    for a, b in zip(ff.tree.leaves(params), ff.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    return err.value


def reference_error(opt, grads, state, params):
    """The exception of the reference path: ``opt.update`` then ``apply_updates``."""
    with pytest.raises((TypeError, ValueError)) as err:
        updates, _ = opt.update(grads, state, params)
        ff.optim.apply_updates(params, updates)
    return err.value


def assert_same_error(fused, reference):
    """The same type and message; only the name of the function that checks may differ
    (``update_and_apply`` where the reference says ``apply_updates``)."""
    assert type(fused) is type(reference), (fused, reference)
    msg, ref = str(fused), str(reference)
    if ref.startswith("apply_updates: "):
        ref = ref.replace("apply_updates: ", "update_and_apply: ", 1)
    assert msg == ref


# ---- update_and_apply checks what opt.update and apply_updates check -------------------

@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_bias_grad_with_an_extra_axis(rng, name):
    """The audit's case: a (1, n) bias gradient used to broadcast the bias to (1, n)."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    grads = random_grads(rng, params)
    layer = int(rng.integers(len(params)))
    n = params[layer]["b"].shape[0]
    grads[layer]["b"] = rng.standard_normal((1, n)).astype(np.float32)
    err = fused_error(opt, grads, state, params)
    assert isinstance(err, ValueError)
    msg = str(err)
    assert f"the update at '{layer}/b' has shape (1, {n})" in msg
    assert f"there have shape ({n},)" in msg
    assert "Fix: pass gradients shaped like the params given to init()" in msg
    assert_same_error(err, reference_error(opt, grads, state, params))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_weight_grad_with_a_batch_axis(rng, name):
    """A (k, out, in) weight gradient used to broadcast the weights to (k, out, in)."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    grads = random_grads(rng, params)
    layer, k = int(rng.integers(len(params))), int(rng.integers(2, 6))
    shape = params[layer]["w"].shape
    grads[layer]["w"] = rng.standard_normal((k, *shape)).astype(np.float32)
    err = fused_error(opt, grads, state, params)
    assert isinstance(err, ValueError)
    assert f"the update at '{layer}/w' has shape {(k, *shape)}" in str(err)
    assert f"there have shape {shape}" in str(err)
    assert "Fix: " in str(err)
    assert_same_error(err, reference_error(opt, grads, state, params))


@pytest.mark.parametrize("name", WITH_BUFFERS)
def test_state_of_another_model(rng, name):
    """Moments of a model with another hidden width used to give a raw NumPy broadcast
    error; now the error names the first leaf whose shape differs."""
    hidden = int(rng.integers(4, 24))
    _, params = random_model(rng, hidden=hidden)
    _, other = random_model(rng, hidden=hidden + int(rng.integers(1, 8)))
    opt = OPTIMIZERS[name]()
    state = opt.init(other)
    grads = random_grads(rng, params)
    err = fused_error(opt, grads, state, params)
    assert isinstance(err, ValueError)
    where = "trace.update" if name in ("momentum", "nesterov") else "scale_by_adam.update"
    assert re.match(rf"{where}: (the update at '0/\w' has shape|the updates have structure)",
                    str(err)), str(err)
    assert "(from init)" in str(err) and "Fix: " in str(err)
    assert_same_error(err, reference_error(opt, grads, state, params))


@pytest.mark.parametrize("name", ["sgd", "sgd_schedule"])
def test_sgd_state_of_another_model_is_fine(rng, name):
    """Plain sgd keeps no arrays like the params, so another model's state fits."""
    _, params = random_model(rng)
    _, other = random_model(rng)
    opt = OPTIMIZERS[name]()
    grads = random_grads(rng, params)
    new, _ = ff.optim.update_and_apply(opt, grads, opt.init(other), params)
    assert [a.shape for a in ff.tree.leaves(new)] == [a.shape for a in ff.tree.leaves(params)]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_none(rng, name):
    """Used to be "cannot unpack non-iterable NoneType object"."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    grads = random_grads(rng, params)
    err = fused_error(opt, grads, None, params)
    assert isinstance(err, ValueError)
    states = 3 if name.startswith("adamw") else 2
    assert (f"chain: expected the state from this chain's init() (a tuple of {states} "
            "states), got NoneType") in str(err)
    assert "Fix: state = opt.init(params) with the same opt" in str(err)
    assert_same_error(err, reference_error(opt, grads, None, params))


@pytest.mark.parametrize("name, other, says", [
    ("momentum", "adam", "trace.update: expected the state its init() makes, "
                         "TraceState(trace), got ScaleByAdamState(count, mu, nu)"),
    ("adam", "momentum", "scale_by_adam.update: expected the state its init() makes, "
                         "ScaleByAdamState(count, mu, nu), got TraceState(trace)"),
    ("sgd", "adam", "identity.update: expected the state its init() makes, EmptyState(), "
                    "got ScaleByAdamState(count, mu, nu)"),
    ("sgd_schedule", "sgd", "scale_by_schedule.update: expected the state its init() makes, "
                            "ScaleByScheduleState(count), got EmptyState()"),
    ("adamw", "adam", "chain: expected the state from this chain's init() (a tuple of 3 "
                      "states), got a tuple of 2"),
])
def test_state_of_another_optimizer(rng, name, other, says):
    """Used to be e.g. "AttributeError: 'ScaleByAdamState' object has no attribute
    'trace'"; opt.update itself now says the same as update_and_apply."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = OPTIMIZERS[other]().init(params)
    grads = random_grads(rng, params)
    err = fused_error(opt, grads, state, params)
    assert says in str(err)
    assert "Fix: state = opt.init(params) with the same opt you call update() on" in str(err)
    assert_same_error(err, reference_error(opt, grads, state, params))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_grads_of_another_structure(rng, name):
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    grads = random_grads(rng, params)[:-1]  # one layer short
    err = fused_error(opt, grads, state, params)
    assert isinstance(err, ValueError)
    assert str(ff.tree.structure(grads)) in str(err)
    assert "Fix: pass gradients with the same structure as the params" in str(err)
    assert_same_error(err, reference_error(opt, grads, state, params))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_grads_that_are_not_floats(rng, name, dtype):
    """sgd's fused host step used to fail with a raw NumPy casting error."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    grads = random_grads(rng, params)
    layer = int(rng.integers(len(params)))
    grads[layer]["w"] = rng.integers(0, 2, params[layer]["w"].shape).astype(dtype)
    err = fused_error(opt, grads, state, params)
    assert isinstance(err, TypeError)
    msg = str(err)
    assert f"the update at '{layer}/w' has dtype {np.dtype(dtype)}" in msg
    assert "must be floating point" in msg and "Fix: pass float gradients" in msg
    ref = reference_error(opt, grads, state, params)
    if name in ("sgd", "sgd_schedule"):  # found by its scale step, which names itself
        assert isinstance(ref, TypeError) and f"'{layer}/w' has dtype {np.dtype(dtype)}" in str(
            ref) and "Fix: pass float gradients" in str(ref)
    else:
        assert_same_error(err, ref)


def test_arguments_in_the_wrong_order(rng):
    _, params = random_model(rng)
    opt = ff.optim.adam(1e-3)
    grads = random_grads(rng, params)
    with pytest.raises(TypeError, match=rf"update_and_apply: opt must be an optimizer .*got "
                                        rf"{type(grads).__name__}\. Fix: "
                                        r"ff\.optim\.update_and_apply\(opt, grads"):
        ff.optim.update_and_apply(grads, opt.init(params), params, opt)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw_masked"])
def test_loss_scaling_wrapper_checks_the_inner_step(rng, name):
    """update_and_apply and update_and_apply_scaled of a dynamic_loss_scaling optimizer
    reach the inner optimizer's fused step through a hook: the same checks run there."""
    _, params = random_model(rng)
    opt = mixed_precision.dynamic_loss_scaling(OPTIMIZERS[name]())
    state = opt.init(params)
    grads = random_grads(rng, params)
    layer = int(rng.integers(len(params)))
    n = params[layer]["b"].shape[0]
    grads[layer]["b"] = rng.standard_normal((1, n)).astype(np.float32)
    with pytest.raises(ValueError, match=rf"at '{layer}/b' has shape \(1, {n}\).*Fix: "):
        ff.optim.update_and_apply(opt, grads, state, params)
    low = ff.tree.map(lambda g: g.astype(np.float16), grads)
    with pytest.raises(ValueError, match=rf"at '{layer}/b' has shape \(1, {n}\).*Fix: "):
        mixed_precision.update_and_apply_scaled(opt, low, state, params)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_loaded_without_like_still_works(rng, tmp_path, name):
    """A checkpoint loaded without ``like`` gives namedtuples of the same names and fields,
    not the original classes: the state checks accept them, on both paths."""
    _, params = random_model(rng)
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    ff.checkpoint.save(tmp_path / "s.safetensors", {"state": state})
    loaded = ff.checkpoint.load(tmp_path / "s.safetensors")["state"]
    assert type(loaded[0]) is not type(state[0])  # a namedtuple class made on loading
    assert loaded[0]._fields == state[0]._fields
    grads = random_grads(rng, params)
    a, _ = ff.optim.update_and_apply(opt, grads, loaded, params)
    updates, _ = opt.update(grads, loaded, params)
    b = ff.optim.apply_updates(params, updates)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


# ---- hyperparameters must be finite ----------------------------------------------------

NON_FINITE = [math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("make", [ff.optim.sgd, ff.optim.adam, ff.optim.adamw],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("lr", NON_FINITE, ids=str)
def test_lr_not_finite(make, lr):
    with pytest.raises(ValueError, match=rf"^{make.__name__}: lr must be a finite number, "
                                         rf"got {lr}\. Fix: {make.__name__}\(1e-3\)$"):
        make(lr)


@pytest.mark.parametrize("lr", NON_FINITE, ids=str)
def test_scale_by_learning_rate_not_finite(lr):
    with pytest.raises(ValueError, match=rf"scale_by_learning_rate: lr must be a finite "
                                         rf"number, got {lr}\. Fix: "):
        ff.optim.scale_by_learning_rate(lr)


HYPERPARAMETERS = {
    "adam: eps": lambda v: ff.optim.adam(1e-3, eps=v),
    "adam: b1": lambda v: ff.optim.adam(1e-3, b1=v),
    "adamw: b2": lambda v: ff.optim.adamw(1e-3, b2=v),
    "adamw: weight_decay": lambda v: ff.optim.adamw(1e-3, weight_decay=v),
    "sgd: momentum": lambda v: ff.optim.sgd(0.1, momentum=v),
    "clip_by_global_norm: max_norm": lambda v: ff.optim.clip_by_global_norm(v),
    "scale: factor": lambda v: ff.optim.scale(v),
    "trace: decay": lambda v: ff.optim.trace(v),
    "scale_by_adam: eps": lambda v: ff.optim.scale_by_adam(eps=v),
    "add_decayed_weights: weight_decay": lambda v: ff.optim.add_decayed_weights(v),
    "step_decay_schedule: decay_rate": lambda v: ff.optim.step_decay_schedule(0.1, 10, v),
    "cosine_decay_schedule: alpha": lambda v: ff.optim.cosine_decay_schedule(0.1, 10, alpha=v),
}


@pytest.mark.parametrize("name", sorted(HYPERPARAMETERS))
@pytest.mark.parametrize("value", NON_FINITE, ids=str)
def test_hyperparameter_not_finite(name, value):
    opt, arg = name.split(": ")
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got {value}\. "
                                         rf"Fix: {opt}\(\.\.\., {arg}="):
        HYPERPARAMETERS[name](value)


def test_int_too_large_for_a_float():
    with pytest.raises(ValueError, match=r"scale: factor must be a finite number"):
        ff.optim.scale(10 ** 400)


def test_finite_edge_values_are_accepted(rng):
    big = float(rng.uniform(1e3, 1e30))
    ff.optim.sgd(0.0)
    ff.optim.sgd(big)
    ff.optim.adamw(1e-3, weight_decay=0.0)
    ff.optim.adamw(1e-3, weight_decay=big)
    ff.optim.clip_by_global_norm(big)
    ff.optim.scale(-big)


# ---- schedules give step sizes: finite and >= 0 -----------------------------------------

def _schedule_cases(x, steps):
    """Each schedule built with ``x`` as the named argument, valid values elsewhere."""
    ok, s = 1e-3, ff.optim
    return {
        "constant_schedule: value": lambda: s.constant_schedule(x),
        "cosine_decay_schedule: init_value": lambda: s.cosine_decay_schedule(x, steps),
        "linear_schedule: init_value": lambda: s.linear_schedule(x, 0.0, steps),
        "linear_schedule: end_value": lambda: s.linear_schedule(ok, x, steps),
        "warmup_cosine_decay_schedule: init_value":
            lambda: s.warmup_cosine_decay_schedule(x, ok, 1, steps + 1),
        "warmup_cosine_decay_schedule: peak_value":
            lambda: s.warmup_cosine_decay_schedule(0.0, x, 1, steps + 1),
        "warmup_cosine_decay_schedule: end_value":
            lambda: s.warmup_cosine_decay_schedule(0.0, ok, 1, steps + 1, end_value=x),
        "step_decay_schedule: init_value": lambda: s.step_decay_schedule(x, steps, 0.5),
    }


SCHEDULE_CASES = sorted(_schedule_cases(0.0, 1))


@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_schedule_with_a_negative_value(rng, case):
    v = float(rng.uniform(1e-5, 1.0))
    opt, arg = case.split(": ")
    with pytest.raises(ValueError) as err:
        _schedule_cases(-v, int(rng.integers(1, 1000)))[case]()
    msg = str(err.value)
    assert msg.startswith(f"{case} must be >= 0.0, got {-v}. Fix: {opt}(..., {arg}={v})"), msg
    assert "a schedule gives step sizes (learning rates)" in msg
    assert "the minus sign of descent is applied for you" in msg


@pytest.mark.parametrize("case", SCHEDULE_CASES)
@pytest.mark.parametrize("bad", NON_FINITE, ids=str)
def test_schedule_with_a_non_finite_value(rng, case, bad):
    opt, arg = case.split(": ")
    with pytest.raises(ValueError, match=rf"^{case} must be a finite number, got {bad}\. "
                                         rf"Fix: {opt}\(\.\.\., {arg}="):
        _schedule_cases(bad, int(rng.integers(1, 1000)))[case]()


@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_schedule_of_zero_or_more_is_accepted(rng, case):
    value = float(rng.choice([0.0, rng.uniform(1e-6, 10.0)]))
    schedule = _schedule_cases(value, int(rng.integers(1, 1000)))[case]()
    assert callable(schedule)


def test_sgd_with_a_negative_schedule_fails_when_built(rng):
    """Before: sgd(constant_schedule(-lr)) was accepted although sgd(-lr) is not."""
    lr = float(rng.uniform(1e-4, 1.0))
    with pytest.raises(ValueError, match=r"constant_schedule: value must be >= 0\.0"):
        ff.optim.sgd(ff.optim.constant_schedule(-lr))


@pytest.mark.parametrize("bad_state", [None, "adam"])
def test_loss_scaling_wants_its_own_state(bad_state):
    model = ff.nn.Serial(ff.nn.Dense(8, "relu"), ff.nn.Dense(3))
    _, params = model.init(ff.random.key(1), (5,))
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3))
    state = ff.optim.adam(1e-3).init(params) if bad_state == "adam" else None
    grads = ff.tree.map(lambda p: np.random.default_rng(2).standard_normal(p.shape)
                        .astype(p.dtype), params)
    for call in (lambda: opt.update(grads, state, params),
                 lambda: ff.optim.update_and_apply(opt, grads, state, params)):
        with pytest.raises(TypeError, match=r"dynamic_loss_scaling.update: expected the state "
                                            r"its init\(\) makes, DynamicScaleState"):
            call()


@pytest.mark.parametrize("grad", [1.0, np.arange(3)], ids=["python_float", "int_array"])
def test_dynamic_loss_scaling_wants_float_array_gradients_before_any_arithmetic(grad):
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3))
    params = {"w": np.ones(3, np.float32)}
    with pytest.raises(TypeError, match=r"dynamic_loss_scaling.update: the update at 'w' "
                                        r"(is a float|has dtype int64), but updates must be "
                                        r"floating point arrays.*Fix: pass float gradients"):
        opt.update({"w": grad}, opt.init(params), params)


@pytest.mark.parametrize("make", [lambda: ff.optim.clip_by_global_norm(1.0),
                                  lambda: ff.optim.scale(0.5)], ids=["clip", "scale"])
def test_stateless_transforms_want_float_array_updates(rng, make):
    """An int gradient would turn clip's factor (0.2, say) into 0: a silent zero step."""
    params = {"w": rng.standard_normal(3).astype(np.float32)}
    opt = ff.optim.chain(make(), ff.optim.sgd(0.1))
    state = opt.init(params)
    for bad, says in ((np.array([3, 4, 0], np.int32), "has dtype int32"),
                      ([3.0, 4.0, 0.0], "is a float")):
        for run in (lambda g: opt.update(g, state, params),
                    lambda g: ff.optim.update_and_apply(opt, g, state, params)):
            with pytest.raises(TypeError, match=f"the update at '(w|w/0)' {says}, but updates "
                               "must be floating point arrays"):
                run({"w": bad})


def test_nesterov_must_be_a_bool():
    for make in (lambda v: ff.optim.sgd(0.1, 0.9, nesterov=v), lambda v: ff.optim.trace(0.9, v)):
        with pytest.raises(TypeError, match="nesterov must be True or False, got str 'no'"):
            make("no")  # truthy: it would have switched Nesterov on
        make(np.bool_(True))


def test_schedule_step_counts_fit_the_int32_count():
    for make in (lambda n: ff.optim.cosine_decay_schedule(0.1, n),
                 lambda n: ff.optim.linear_schedule(0.1, 0.0, n),
                 lambda n: ff.optim.warmup_cosine_decay_schedule(0.0, 0.1, 10, n)):
        with pytest.raises(ValueError, match="at most 2147483647, got 3000000000: the step "
                                             "count is an int32"):
            make(3_000_000_000)
        assert float(make(2 ** 31 - 1)(np.asarray(0, np.int32))) >= 0


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_integer_param_is_named_as_untrainable(rng, name):
    """A counter kept in params: the fix is to keep it out (not g.astype('int32'), which
    the next error would contradict)."""
    params = {"w": rng.standard_normal(3).astype(np.float32), "step": np.zeros((), np.int32)}
    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    for g_step in (np.zeros((), np.int32), np.zeros((), np.float32)):
        grads = {"w": rng.standard_normal(3).astype(np.float32), "step": g_step}
        with pytest.raises(TypeError, match="at 'step' are int32: only floating-point params "
                                            "can be trained. Fix: make that param a float "
                                            "array, or keep a value that is not trained out"):
            ff.optim.update_and_apply(opt, grads, state, params)


@pytest.mark.parametrize("name", sorted(set(OPTIMIZERS) - {"adamw_masked"}))  # its mask
def test_a_python_number_param_is_named_not_an_attribute_error(rng, name):  # reads .ndim
    params = {"w": rng.standard_normal(3).astype(np.float32), "gain": 1.0}
    grads = {"w": rng.standard_normal(3).astype(np.float32), "gain": 0.5}
    opt = OPTIMIZERS[name]()
    for run in (lambda: ff.optim.update_and_apply(opt, grads, opt.init(params), params),
                lambda: opt.update(grads, opt.init(params), params)):
        with pytest.raises(TypeError, match="at 'gain' is a float, (not an array|but updates "
                                            "must be floating point arrays)"):
            run()
