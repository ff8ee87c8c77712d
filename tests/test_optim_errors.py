"""Bad optimizer input gets an error that names the optimizer (or function), what was
expected, what came, and the fix: non-finite hyperparameters, negative schedules.

The models, values and shapes are drawn fresh each run; a failure's captured output shows
the seed (``FUSEFLOW_TEST_SEED=<seed>`` in the environment repeats it).
"""

import math
import os
import secrets

import numpy as np
import pytest

import fuseflow as ff


class _Rng:
    """A NumPy Generator that remembers its seed (for failure messages)."""

    def __init__(self, seed):
        self.seed = seed
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._g, name)


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FUSEFLOW_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"FUSEFLOW_TEST_SEED={seed}")  # shown with a failure's captured output
    return _Rng(seed)


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
