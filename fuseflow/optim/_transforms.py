"""Building blocks: small gradient transformations that optimizers are chained from.

Each follows optax's transform of the same name, to the operation order, so results agree
with optax to float32 rounding. Hyperparameters are Python floats, so they never promote
float32 leaves (see ``scalar_like``). A new state is built as ``type(state)(...)``: a state
loaded from a checkpoint without ``like`` keeps its classes, so a step (``ff.compile``,
``dynamic_loss_scaling``) returns the structure it was given.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np  # only to recognise NumPy bools in a mask, never on leaves
import optree

from fuseflow import tree
from fuseflow._namespace import namespace
from fuseflow.optim._base import (
    EmptyState,
    GradientTransformation,
    bias_corrections,
    check_empty_state,
    check_flag,
    check_float_updates,
    check_like,
    check_lr,
    check_number,
    check_state,
    empty_init,
    float_leaf,
    increment,
    scalar_like,
    schedule_value,
    zero_count,
)


def scale(factor: float) -> GradientTransformation:
    """Multiplies updates by a constant ``factor``."""
    factor = check_number("scale", "factor", factor, example=-0.1)
    check = check_empty_state("scale.update")

    def update(updates, state, params=None):
        check(updates, state)
        return tree.map(lambda g: float_leaf("scale.update", g, updates) * factor,
                        updates), state

    update.check_args = check
    return GradientTransformation(empty_init, update)


class ScaleByScheduleState(NamedTuple):
    count: Any  # 0-d int32 array: steps taken


def scale_by_schedule(step_size_fn) -> GradientTransformation:
    """Multiplies updates by ``step_size_fn(count)``, then counts the step."""
    if not callable(step_size_fn):
        raise TypeError(f"scale_by_schedule: expected a callable count -> step size, got "
                        f"{type(step_size_fn).__name__}. Fix: scale_by_schedule(lambda c: 0.1)")

    def init(params):
        return ScaleByScheduleState(count=zero_count(params))

    def check(updates, state, params=None):
        check_state("scale_by_schedule.update", state, ScaleByScheduleState)

    def update(updates, state, params=None):
        check(updates, state)
        step = schedule_value("scale_by_schedule", step_size_fn, state.count)
        updates = tree.map(lambda g: float_leaf("scale_by_schedule.update", g, updates)
                           * scalar_like(step, g), updates)
        return updates, type(state)(count=increment(state.count))

    update.check_args = check
    return GradientTransformation(init, update)


def scale_by_learning_rate(lr, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiplies updates by ``-lr`` (``lr`` if not ``flip_sign``); lr a float or schedule."""
    lr = check_lr("scale_by_learning_rate", lr)
    m = -1.0 if flip_sign else 1.0
    if callable(lr):
        return scale_by_schedule(
            lambda count: m * schedule_value("scale_by_learning_rate", lr, count))
    return scale(m * lr)


def _array(value, like):
    """``value`` as an array of ``like``'s namespace: NumPy turns arithmetic on 0-d arrays
    into scalars, and optimizer state must stay arrays (checkpoints, donation, in-place
    updates)."""
    return namespace(like).asarray(value)


class TraceState(NamedTuple):
    trace: Any  # pytree like params: the momentum buffer


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: ``t = g + decay * t``; emits ``t`` (or ``g + decay * t`` if nesterov)."""
    decay = check_number("trace", "decay", decay, low=0.0, high=1.0, example=0.9)
    nesterov = check_flag("trace", "nesterov", nesterov)

    def init(params):
        return TraceState(trace=tree.zeros_like(params))

    def check(updates, state, params=None):
        check_state("trace.update", state, TraceState)
        check_like("trace.update", updates, state.trace, "momentum buffers (from init)",
                   kept=True)

    def update(updates, state, params=None):
        check(updates, state)
        new_trace = tree.map(lambda g, t: _array(g + decay * t, t), updates, state.trace)
        if nesterov:
            updates = tree.map(lambda g, t: g + decay * t, updates, new_trace)
        else:
            updates = new_trace
        return updates, type(state)(trace=new_trace)

    update.check_args = check
    return GradientTransformation(init, update)


class ScaleByAdamState(NamedTuple):
    count: Any  # 0-d int32 array: steps taken
    mu: Any  # pytree like params: first moment
    nu: Any  # pytree like params: second moment


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Adam's direction ``mu_hat / (sqrt(nu_hat) + eps)`` with bias-corrected moments."""
    b1 = check_number("scale_by_adam", "b1", b1, low=0.0, high=1.0, example=0.9)
    b2 = check_number("scale_by_adam", "b2", b2, low=0.0, high=1.0, example=0.999)
    eps = check_number("scale_by_adam", "eps", eps, low=0.0, low_open=True, example=1e-8)

    def init(params):
        return ScaleByAdamState(count=zero_count(params), mu=tree.zeros_like(params),
                                nu=tree.zeros_like(params))

    def check(updates, state, params=None):
        check_state("scale_by_adam.update", state, ScaleByAdamState)
        check_like("scale_by_adam.update", updates, state.mu, "moments (from init)", kept=True)

    def update(updates, state, params=None):
        check(updates, state)
        # narrower updates (float16 grads) in the moments' dtype first: in float16,
        # (1 - b1) * g would round and g * g overflow above 256
        updates = tree.map(lambda g, m: g.astype(m.dtype, copy=False), updates, state.mu)
        mu = tree.map(lambda g, m: _array((1 - b1) * g + b1 * m, m), updates, state.mu)
        nu = tree.map(lambda g, v: _array((1 - b2) * (g * g) + b2 * v, v), updates, state.nu)
        count = increment(state.count)
        corrections = {}  # leaf dtype -> (1 - b1**count, 1 - b2**count)

        def direction(m, v):
            if m.dtype not in corrections:
                corrections[m.dtype] = bias_corrections(count, m.dtype, b1, b2)
            c1, c2 = corrections[m.dtype]
            return (m / c1) / (namespace(m).sqrt(v / c2) + eps)

        updates = tree.map(direction, mu, nu)
        return updates, type(state)(count=count, mu=mu, nu=nu)

    update.check_args = check
    return GradientTransformation(init, update)


def _mask_leaves(where, mask, params):
    """The mask broadcast to one Python bool per leaf of ``params``."""
    m = mask(params) if callable(mask) else mask
    try:
        full = optree.tree_broadcast_prefix(m, params, none_is_leaf=False)
        # flattened by the params' structure, so that each flag meets its leaf by key: the
        # broadcast keeps the mask's mapping order (a dict mask over OrderedDict params)
        flags = tree.structure(params).flatten_up_to(full)
    except ValueError:
        raise ValueError(
            f"{where}: the mask has structure {tree.structure(m)}, which does not match "
            f"the params' structure {tree.structure(params)}. Fix: build it from the "
            "params, e.g. mask=ff.tree.map(lambda p: p.ndim > 1, params), or pass a "
            "callable: mask=lambda params: ff.tree.map(lambda p: p.ndim > 1, params)"
        ) from None
    bad = [f for f in flags if not isinstance(f, (bool, np.bool_))]
    if bad:
        raise TypeError(
            f"{where}: mask leaves must be bools (True = decay this leaf), got "
            f"{type(bad[0]).__name__} {bad[0]!r}. Fix: ff.tree.map(lambda p: p.ndim > 1, params)")
    return [bool(f) for f in flags]


def add_decayed_weights(weight_decay: float = 0.0, mask=None) -> GradientTransformation:
    """Adds ``weight_decay * param`` to each update (only where ``mask`` is True).

    ``mask``: None (decay every leaf), a pytree of bools like the params (or a prefix of
    it), or a callable params -> such a pytree.
    """
    wd = check_number("add_decayed_weights", "weight_decay", weight_decay, low=0.0,
                      example=1e-4)

    def init(params):
        if mask is not None:
            _mask_leaves("add_decayed_weights", mask, params)  # fail at init, not step 1
        return EmptyState()

    def check(updates, state, params=None):
        check_state("add_decayed_weights.update", state, EmptyState)
        if params is None:
            raise ValueError("add_decayed_weights needs the params. "
                             "Fix: opt.update(grads, state, params)")
        check_like("add_decayed_weights.update", updates, params, "params")

    def update(updates, state, params=None):
        check(updates, state, params)
        if mask is None:
            return tree.map(lambda g, p: g + wd * p, updates, params), state
        flags = _mask_leaves("add_decayed_weights", mask, params)
        gs, treedef = tree.flatten(updates)
        out = [g + wd * p if f else g for g, p, f in zip(gs, tree.leaves(params), flags)]
        return tree.unflatten(treedef, out), state

    update.check_args = check
    return GradientTransformation(init, update)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scales all updates by ``max_norm / norm`` when their global L2 norm exceeds it."""
    max_norm = check_number("clip_by_global_norm", "max_norm", max_norm, low=0.0,
                            low_open=True, example=1.0)
    check = check_empty_state("clip_by_global_norm.update")

    def update(updates, state, params=None):
        check(updates, state)
        if not tree.leaves(updates):
            return updates, state
        check_float_updates("clip_by_global_norm.update", updates)
        norm = tree.l2_norm(updates)
        # One factor for all leaves, no host branch: 1 when norm <= max_norm (also when
        # norm is 0), and NaN stays NaN.
        factor = max_norm / namespace(norm).maximum(norm, max_norm)
        return tree.map(lambda g: g * scalar_like(factor, g), updates), state

    update.check_args = check
    return GradientTransformation(empty_init, update)
