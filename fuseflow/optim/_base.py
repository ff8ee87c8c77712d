"""The optimizer contract, and the pieces every transform shares.

A ``GradientTransformation`` is a pair of pure functions (as in optax)::

    init(params) -> state
    update(updates, state, params=None) -> (updates, new_state)

``updates`` start as the gradients and leave as the step to add to the params
(``apply_updates``). State is a NamedTuple of arrays only (step counts are 0-d int32
arrays), so a whole training step can later be captured in a CUDA graph.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np  # dtype promotion rules only, never on leaves

from fuseflow import tree
from fuseflow._dtypes import accumulation, is_float
from fuseflow._namespace import is_array, namespace


class GradientTransformation(NamedTuple):
    init: Callable[[Any], Any]
    update: Callable[..., tuple]


class EmptyState(NamedTuple):
    """The state of a transform that keeps nothing between steps."""


def empty_init(params):
    """``init`` of a transform that keeps nothing between steps."""
    return EmptyState()


def identity() -> GradientTransformation:
    """Passes updates through unchanged."""
    check = check_empty_state("identity.update")

    def update(updates, state, params=None):
        check(updates, state)
        return updates, state

    update.check_args = check
    return GradientTransformation(empty_init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Applies ``transforms`` in order; the state is the tuple of their states."""
    for i, t in enumerate(transforms):
        if not isinstance(t, GradientTransformation):
            raise TypeError(
                f"chain: argument {i} is {type(t).__name__} {t!r}, not a GradientTransformation. "
                "Fix: call the constructors, e.g. chain(clip_by_global_norm(1.0), adam(1e-3))")

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def check_chain_state(state):
        if not isinstance(state, tuple) or len(state) != len(transforms):
            got = (f"a tuple of {len(state)}" if type(state) is tuple
                   else type(state).__name__)
            raise ValueError(
                f"chain: expected the state from this chain's init() (a tuple of "
                f"{len(transforms)} states), got {got}. "
                "Fix: state = opt.init(params) with the same opt you call update() on")

    def check(updates, state, params=None):
        # every transform here keeps the updates' structure and shapes, so each one's
        # checks can see the incoming updates
        check_chain_state(state)
        for t, s in zip(transforms, state):
            check_update_args(t, updates, s, params)

    def update(updates, state, params=None):
        check_chain_state(state)  # each transform's update runs its own checks
        new_state = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    update.check_args = check
    return GradientTransformation(init, update)


def check_update_args(transform, updates, state, params=None):
    """Run the checks ``transform.update`` makes of its arguments (tree structure, leaf shapes
    and dtypes, the state's type), without the update: metadata only, no array values read.
    ``update_and_apply`` runs them before its fused step, so both paths fail alike. A
    transform's update declares them as its ``check_args`` attribute; one without checks
    (a user's own transform) passes."""
    check = own_attribute(transform.update, "check_args")
    if check is not None:
        check(updates, state, params)


def own_attribute(update, name):
    """``update.<name>`` (a marker a transform's update declares: ``check_args``,
    ``fused_spec``, ``fused_apply``), or None when it has none of its own.

    ``functools.wraps`` copies the wrapped function's attributes onto the wrapper: a user's
    wrapper of ``adam(...).update`` (one that adds gradient noise, say) would inherit
    adam's ``fused_spec``, and ``update_and_apply`` would run adam's fused step in its
    place, silently skipping the wrapper. A marker that is the wrapped function's own
    (``__wrapped__``) is therefore not the wrapper's."""
    value = getattr(update, name, None)
    if value is not None and value is getattr(getattr(update, "__wrapped__", None), name, None):
        return None
    return value


def apply_updates(params, updates):
    """``params + updates``, leaf by leaf, keeping each param's dtype."""
    check_like("apply_updates", updates, params, "params")
    # asarray, not astype: NumPy turns 0-d arithmetic into scalars; params stay arrays.
    return tree.map(lambda p, u: namespace(p).asarray(p + u, dtype=p.dtype), params, updates)


# ---- helpers shared by the transforms (not public) ----

def zero_count(params):
    """A 0-d int32 step counter on the params' device."""
    ls = tree.leaves(params)
    xp = namespace(ls[0]) if ls else namespace(0)
    return xp.zeros((), dtype=xp.int32)


def increment(count):
    """``count + 1`` that saturates at the int32 maximum instead of wrapping (as optax)."""
    xp = namespace(count)
    return xp.asarray(count + (count < xp.iinfo(count.dtype).max))


def schedule_value(where, schedule, count):
    """``schedule(count)``, refused unless it is one step size: a Python number or a 0-d
    real array (metadata only: no device value is read). A vector would broadcast against
    the updates (a step size per column, silently), and ``None`` (a schedule without a
    ``return``) or a tuple (a trailing comma) would fail deep in the arithmetic."""
    value = schedule(count)
    if type(value) in (int, float) or (
            getattr(value, "shape", None) == () and
            getattr(getattr(value, "dtype", None), "kind", None) in ("i", "u", "f")):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        got = f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    elif isinstance(value, (tuple, list)):
        got = f"a {type(value).__name__} of {len(value)}"
    else:
        got = f"{type(value).__name__} {value!r}"[:80]
    name = getattr(schedule, "__name__", type(schedule).__name__)
    raise TypeError(
        f"{where}: the schedule {name} returned {got}, but a step size is one number (a "
        "Python float or a 0-d array). Fix: return one value per count, e.g. "
        "return 1e-3 * xp.minimum(1.0, (count + 1) / 100) with xp = "
        "ff.backend.namespace(count) "
        "(a function without a return statement returns None)")


def scalar_like(s, leaf):
    """``s`` ready to multiply ``leaf`` without changing its dtype.

    Under NumPy 2 (NEP 50) a Python float is weak and keeps float32, but a NumPy float64
    scalar or 0-d array (what a schedule or a norm returns) promotes float32 to
    float64; so cast those to the leaf's dtype, on the leaf's device.
    """
    return s if type(s) in (int, float) else s.astype(leaf.dtype)


def check_like(where, updates, reference, ref_name, *, kept=False):
    """Raise if ``updates`` differ from ``reference`` in tree structure or leaf shapes, or
    are not floating point (metadata only: no array values are read).

    ``kept``: the reference is state the transform keeps (moments, momentum): an update
    of a wider dtype (float64 grads, float32 moments) would silently widen that state, and
    it would then no longer fit ``opt.init(params)`` (checkpoints loaded with ``like``, a
    compiled step); narrower ones (mixed precision's float16 grads) are fine."""
    u_leaves, got = tree.flatten(updates)
    r_leaves, want = tree.flatten(reference)
    if got != want:
        raise ValueError(
            f"{where}: the updates have structure {got}, but the {ref_name} have {want}. "
            "Fix: pass gradients with the same structure as the params given to init() "
            "(or call init() again for the new params)")
    for u, r in zip(u_leaves, r_leaves):
        try:  # every eager step runs this loop: one test per leaf, no hasattr calls
            bad = u.shape != r.shape or not is_float(u.dtype) or not is_float(r.dtype) or (
                kept and _widens(u, r))
        except AttributeError:  # a leaf that is not an array (a Python number)
            bad = True
        if bad:
            _raise_unlike(where, u_leaves, r_leaves, tree.paths(reference), ref_name, kept)


def _widens(u, r):
    """``u`` combined with ``r`` has a wider dtype than ``r``."""
    return u.dtype != r.dtype and np.promote_types(u.dtype, r.dtype) != r.dtype


def _raise_unlike(where, u_leaves, r_leaves, paths, ref_name, kept=False):
    """The error of ``check_like`` for the first leaf that fails it."""
    for path, u, r in zip(paths, u_leaves, r_leaves):
        for what, a in (("update", u), (ref_name, r)):
            if not is_array(a):
                raise TypeError(
                    f"{where}: the {what} at {path!r} is a {type(a).__name__}, not an array. "
                    "Fix: params and gradients are arrays; a scalar param is a 0-d array, "
                    "np.asarray(value, np.float32)")
        if u.shape != r.shape:
            raise ValueError(
                f"{where}: the update at {path!r} has shape {tuple(u.shape)}, but the "
                f"{ref_name} there have shape {tuple(r.shape)}. Fix: pass gradients shaped "
                "like the params given to init(); if the model changed, make a new state "
                "with opt.init(new_params)")
        if not is_float(r.dtype):
            raise TypeError(
                f"{where}: the {ref_name} at {path!r} are {r.dtype}: only floating-point "
                "params can be trained. Fix: make that param a float array, or keep a value "
                "that is not trained out of the params (a layer attribute; see "
                "docs/custom-layers.md)")
        if not is_float(u.dtype):
            raise TypeError(
                f"{where}: the update at {path!r} has dtype {u.dtype}, but updates must be "
                f"floating point (the {ref_name} there are {r.dtype}). Fix: pass float "
                f"gradients, e.g. g.astype({r.dtype.name!r})")
        if kept and _widens(u, r):
            raise TypeError(
                f"{where}: the update at {path!r} has dtype {u.dtype}, but the {ref_name} "
                f"there are {r.dtype}: they would become "
                f"{np.promote_types(u.dtype, r.dtype)}, and the state would no longer match "
                f"opt.init(params). Fix: pass gradients in the params' dtype, e.g. "
                f"g.astype({r.dtype.name!r}); a transform of your own before this one in a "
                "chain must keep each update's dtype (multiply by s.astype(g.dtype), not by "
                "a float64 array s; see docs/optimizers.md)")


def check_state(where, state, cls):
    """Raise unless ``state`` is a ``cls``, the state type that this transform's init()
    makes, or a NamedTuple with the same fields (a state loaded from a checkpoint without
    ``like`` comes back as one of those, see ``fuseflow.checkpoint``); for ``EmptyState``
    a plain ``()`` does too."""
    if isinstance(state, cls):
        return
    fields = getattr(state, "_fields", None)
    if isinstance(state, tuple) and (fields == cls._fields or (fields is None and not cls._fields
                                                               and not state)):
        return
    got = type(state).__name__ + (f"({', '.join(fields)})" if fields is not None else "")
    raise TypeError(
        f"{where}: expected the state its init() makes, {cls.__name__}"
        f"({', '.join(cls._fields)}), got {got}: the state of another optimizer? "
        "Fix: state = opt.init(params) with the same opt you call update() on")


def check_empty_state(where):
    """The ``check_args`` of a transform that keeps no state (see ``check_update_args``)."""
    def check(updates, state, params=None):
        check_state(where, state, EmptyState)
    return check


def _is_float_array(a):
    return is_array(a) and is_float(a.dtype)


def float_leaf(where, g, updates):
    """``g``, a leaf of ``updates``, if it is a floating-point array; else the error of
    ``check_float_updates`` (for transforms that scale their updates: an integer gradient
    would turn the factor into 0, a silent zero step). Costs one attribute test per leaf
    inside the transform's own tree.map."""
    if not _is_float_array(g):
        check_float_updates(where, updates)
    return g


def check_float_updates(where, updates):
    """Raise unless every leaf of ``updates`` is a floating-point array (metadata only)."""
    leaves = tree.leaves(updates)
    if all(_is_float_array(u) for u in leaves):
        return
    for path, u in zip(tree.paths(updates), leaves):
        if not _is_float_array(u):
            got = f"has dtype {u.dtype}" if hasattr(u, "dtype") else f"is a {type(u).__name__}"
            raise TypeError(f"{where}: the update at {path!r} {got}, but updates must be "
                            "floating point arrays (gradients). Fix: pass float gradients, "
                            "e.g. g.astype(np.float32)")


# ---- argument checks, run when an optimizer is built ----

def check_flag(opt, name, value):
    """A bool option (a truthy string such as "no" must not switch it on)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{opt}: {name} must be True or False, got {type(value).__name__} "
                        f"{value!r}. Fix: {opt}(..., {name}=True)")
    return bool(value)


def _is_number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_lr(opt, lr):
    """A float lr becomes a Python float (weak, see scalar_like); a schedule stays."""
    if callable(lr):
        return lr
    if not _is_number(lr):
        raise TypeError(
            f"{opt}: lr must be a float or a schedule (a callable step -> lr), got "
            f"{type(lr).__name__} {lr!r}. Fix: {opt}(1e-3) or "
            f"{opt}(ff.optim.cosine_decay_schedule(1e-3, 1000))")
    if not _is_finite(lr):
        raise ValueError(f"{opt}: lr must be a finite number, got {lr}. Fix: {opt}(1e-3)")
    if lr < 0:
        raise ValueError(
            f"{opt}: lr must be >= 0, got {lr}. Fix: {opt}({abs(lr)}); "
            "the minus sign of descent is applied for you")
    return float(lr)


def _is_finite(x):
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def check_number(opt, name, value, *, low=None, high=None, low_open=False, example,
                 note=""):
    """Check that ``value`` is finite and ``low <= value < high`` (``low < value`` if
    ``low_open``; None: no bound). ``note``: said after the fix, e.g. why the bound.

    Returns the value as a Python float, which never promotes a float32 leaf.
    """
    fix = f"Fix: {opt}(..., {name}={example}){note}"
    if not _is_number(value):
        raise TypeError(f"{opt}: {name} must be a number, got {type(value).__name__} "
                        f"{value!r}. {fix}")
    if not _is_finite(value):  # inf, -inf, NaN
        raise ValueError(f"{opt}: {name} must be a finite number, got {value}. {fix}")
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or value < high
    if not (above and below):
        if low is None:
            want = f"< {high}"
        elif high is None:
            want = f"{'>' if low_open else '>='} {low}"
        else:
            want = f"in {'(' if low_open else '['}{low}, {high})"
        raise ValueError(f"{opt}: {name} must be {want}, got {value}. {fix}")
    return float(value)


def bias_corrections(count, dtype, b1, b2):
    """``(1 - b1**count, 1 - b2**count)`` as optax (JAX) forms them: in the leaf's dtype, or
    in float32 for 16-bit leaves and then rounded (bfloat16's 0.999 is 1.0, so its own
    powers would leave 0). float64 corrections of float32 leaves would be more exact but
    differ from optax by up to 1e-5 in the first steps."""
    acc = accumulation(dtype)
    t, f = count.astype(acc), acc.type
    return tuple((1 - f(b) ** t).astype(dtype, copy=False) for b in (b1, b2))
