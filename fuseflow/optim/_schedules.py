"""Learning-rate schedules: functions ``count -> value``, usable wherever ``lr`` is.

``count`` is the 0-d int32 step counter from the optimizer state (a NumPy or CuPy array;
a Python int works too). The value is computed with that array's own library, on its
device, in float64; the transform that uses it casts it to each leaf's dtype. Each
schedule matches optax's function of the same name (``step_decay_schedule`` is optax's
``exponential_decay(..., staircase=True)``).

The schedules here that are constant from some count on record it (``horizon_of``: the
first count from which every value equals that one's); on the GPU the fused optimizers then
read them from a table of their values (``ff.optim.update_and_apply``). The record is kept
here, not on the function, so a wrapper (``functools.wraps`` copies attributes) never
inherits it.
"""

from __future__ import annotations

import numbers
import weakref

from fuseflow._namespace import namespace
from fuseflow.optim._base import check_number


_HORIZONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def horizon_of(schedule):
    """The count from which ``schedule`` (one made by this module) stays constant, or None."""
    try:
        return _HORIZONS.get(schedule)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def _flat_from(schedule, horizon):
    _HORIZONS[schedule] = int(horizon)
    return schedule


def _steps(opt, name, value, *, low=1):
    fix = f"Fix: {opt}(..., {name}=1000)"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{opt}: {name} must be an int (a number of steps), got "
                        f"{type(value).__name__} {value!r}. {fix}")
    if value < low:
        raise ValueError(f"{opt}: {name} must be >= {low}, got {value}. {fix}")
    if value > _MAX_COUNT:
        raise ValueError(f"{opt}: {name} must be at most {_MAX_COUNT}, got {value}: the step "
                         f"count is an int32, as optax's. {fix}")
    return int(value)


#: the largest step count (an int32 that saturates there, see ``_base.increment``)
_MAX_COUNT = 2 ** 31 - 1


def _step_size(opt, name, value, example):
    """A value a schedule takes on: a step size (an lr), so finite and >= 0, as ``lr``."""
    note = ""
    if isinstance(value, numbers.Real) and value < 0 and value != float("-inf"):
        example, note = -value, ("; a schedule gives step sizes (learning rates), and the "
                                 "minus sign of descent is applied for you")
    return check_number(opt, name, value, low=0.0, example=example, note=note)


def constant_schedule(value: float):
    value = _step_size("constant_schedule", "value", value, example=1e-3)
    return lambda count: value


def linear_schedule(init_value: float, end_value: float, transition_steps: int,
                    transition_begin: int = 0):
    """``init_value`` until ``transition_begin``, then linear to ``end_value`` over
    ``transition_steps`` steps, then ``end_value``."""
    opt = "linear_schedule"
    init_value = _step_size(opt, "init_value", init_value, example=1e-3)
    end_value = _step_size(opt, "end_value", end_value, example=0.0)
    transition_steps = _steps(opt, "transition_steps", transition_steps)
    transition_begin = _steps(opt, "transition_begin", transition_begin, low=0)

    def schedule(count):
        xp = namespace(count)
        frac = 1 - xp.clip(count - transition_begin, 0, transition_steps) / transition_steps
        return (init_value - end_value) * frac + end_value

    return _flat_from(schedule, transition_begin + transition_steps)


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0):
    """Half a cosine from ``init_value`` down to ``alpha * init_value`` over
    ``decay_steps`` steps, then flat."""
    opt = "cosine_decay_schedule"
    init_value = _step_size(opt, "init_value", init_value, example=1e-3)
    decay_steps = _steps(opt, "decay_steps", decay_steps)
    alpha = check_number(opt, "alpha", alpha, low=0.0, example=0.0)

    def schedule(count):
        xp = namespace(count)
        cosine = 0.5 * (1 + xp.cos(xp.pi * xp.minimum(count, decay_steps) / decay_steps))
        return init_value * ((1 - alpha) * cosine + alpha)

    return _flat_from(schedule, decay_steps)


def warmup_cosine_decay_schedule(init_value: float, peak_value: float, warmup_steps: int,
                                 decay_steps: int, end_value: float = 0.0):
    """Linear from ``init_value`` to ``peak_value`` over ``warmup_steps``, then cosine
    down to ``end_value`` at ``decay_steps`` (which counts the warmup, as in optax)."""
    opt = "warmup_cosine_decay_schedule"
    init_value = _step_size(opt, "init_value", init_value, example=0.0)
    peak_value = _step_size(opt, "peak_value", peak_value, example=1e-3)
    end_value = _step_size(opt, "end_value", end_value, example=0.0)
    warmup_steps = _steps(opt, "warmup_steps", warmup_steps, low=0)
    decay_steps = _steps(opt, "decay_steps", decay_steps)
    if decay_steps <= warmup_steps:
        raise ValueError(
            f"{opt}: decay_steps ({decay_steps}) must exceed warmup_steps ({warmup_steps}): "
            f"it is the length of the whole schedule, warmup included. "
            f"Fix: {opt}(..., warmup_steps={warmup_steps}, decay_steps={warmup_steps + 1000})")
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    decay = cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha)
    if warmup_steps == 0:
        return decay
    warmup = linear_schedule(init_value, peak_value, warmup_steps)

    def schedule(count):
        return namespace(count).where(count < warmup_steps, warmup(count),
                                      decay(count - warmup_steps))

    return _flat_from(schedule, decay_steps)


def step_decay_schedule(init_value: float, step_size: int, decay_rate: float):
    """``init_value * decay_rate ** floor(count / step_size)``."""
    opt = "step_decay_schedule"
    init_value = _step_size(opt, "init_value", init_value, example=1e-3)
    step_size = _steps(opt, "step_size", step_size)
    decay_rate = check_number(opt, "decay_rate", decay_rate, low=0.0, low_open=True,
                              example=0.5)

    def schedule(count):
        xp = namespace(count)
        return init_value * xp.power(decay_rate, xp.floor(count / step_size))

    return schedule
