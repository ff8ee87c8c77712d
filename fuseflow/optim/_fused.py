"""``update_and_apply``: the optimizer step, in one GPU kernel launch where possible.

``opt.update`` followed by ``apply_updates`` is a chain of small elementwise operations per
parameter tensor: dozens of kernel launches per step for Adam. For the named optimizers
(sgd with or without momentum, adam, adamw; constant or scheduled lr) on CUDA arrays,
``update_and_apply`` runs the same arithmetic as ONE multi-tensor kernel over every tensor.
Inside ``ff.compile`` it updates the (donated) params and moments in place. On NumPy arrays
the same optimizers run ``_host_update``: the reference operations in the same order (the
same bits) with fewer temporaries. Anything else (chains with clipping, other transforms)
runs the reference path, so the function is always safe to call.
"""

from __future__ import annotations

import weakref

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds

from fuseflow import backend, tree
from fuseflow._namespace import host_sync_allowed, is_cupy, namespace
from fuseflow.optim._base import (
    apply_updates,
    bias_corrections,
    check_like,
    check_update_args,
    increment,
    own_attribute,
    scalar_like,
    schedule_value,
)
from fuseflow.optim._schedules import horizon_of

__all__ = ["update_and_apply", "fused_spec", "fused_update", "kept_unless_finite"]


def fused_spec(transformation, **spec):
    """Mark a named optimizer as fusable: its hyperparameters, for ``update_and_apply``."""
    transformation.update.fused_spec = spec
    return transformation


def update_and_apply(opt, grads, opt_state, params, *, donate_grads=False):
    """``(new_params, new_opt_state)`` = ``opt.update`` then ``apply_updates``, fused.

    ``donate_grads=True`` lets the update reuse the gradient buffers for the new params (on
    the host: no fresh memory per step); only for grads nobody reads or writes afterwards,
    such as those ``ff.train.make_step`` gets from fuseflow's own layers (a layer that
    refilled a kept buffer would write into the new params). A gradient that shares memory
    with another gradient, a param or an optimizer slot is never written. Wrappers (such as
    ``mixed_precision.dynamic_loss_scaling``) take part through a
    ``fused_apply(grads, state, params)`` hook on their update function.

    Bad arguments fail as in ``opt.update`` then ``apply_updates``, with the same errors,
    on either path (see ``fused_update``).
    """
    if not callable(getattr(opt, "update", None)):  # duck-typed, as the reference path
        raise TypeError(
            f"update_and_apply: opt must be an optimizer (a GradientTransformation), got "
            f"{type(opt).__name__}. Fix: ff.optim.update_and_apply(opt, grads, opt_state, "
            "params) with opt = ff.optim.adam(1e-3) (or another ff.optim optimizer)")
    hook = own_attribute(opt.update, "fused_apply")  # not one a wrapper copied (wraps)
    if hook is not None:
        out = hook(grads, opt_state, params)
    else:
        out = fused_update(opt, grads, opt_state, params, donate_grads=donate_grads)
    if out is not None:
        return out
    updates, opt_state = opt.update(grads, opt_state, params)
    return apply_updates(params, updates), opt_state


def fused_update(opt, grads, opt_state, params, *, finite=None, donate_grads=False,
                 grad_scale=None, low=None, widen_grads=False):
    """The fused step of a named optimizer, or None when it has no fused form here.

    ``finite`` (a 0-d bool device array, or a function returning one that is called only if
    the kernel runs) makes the step keep the params and the whole state, step counts
    included, unchanged when False (the kernel stores the old values and counts; a count
    it does not write is selected with ``where``): ``dynamic_loss_scaling``'s skipped
    step, with no further launch for the state. ``grad_scale`` (a 0-d
    float32 array): the gradients are ``grads.astype(float32) * grad_scale``, formed
    inside the kernel (mixed precision's scaled 16-bit gradients). ``low``: a
    lower-precision copy of ``params`` (same structure) that the kernel rewrites from the
    new params; the result is then ``(new_params, new_opt_state, new_low)``.
    ``widen_grads``: 16-bit gradients of float32 params stand for their float32 values
    (``mixed_precision.compute_copy``'s), which the GPU kernel reads; without it (or a
    ``grad_scale``) such mixed dtypes take the reference's promotions. On NumPy the
    flag is read on the host first (``grad_scale`` is formed by it, as by the GPU's
    check), and the host update runs on the unscaled gradients.

    First it makes ``opt.update``'s own checks of its arguments and ``apply_updates``'
    check of the grads against the params (tree structure, leaf shapes and dtypes, the
    state's types): the same errors as the reference path. They read metadata only, never
    a device value; inside ``ff.compile`` they run when the step is captured, not per call.
    """
    spec = own_attribute(opt.update, "fused_spec")  # not one a wrapper copied (wraps)
    if spec is None:
        return None
    check_update_args(opt, grads, opt_state, params)
    check_like("update_and_apply", grads, params, "params")
    return _fused(spec, grads, opt_state, params, finite, donate_grads, grad_scale, low,
                  widen_grads)


def _fused(spec, grads, state, params, finite=None, donate_grads=False, grad_scale=None,
           low=None, widen_grads=False):
    kind, lr = spec["kind"], spec["lr"]
    p_leaves, treedef = tree.flatten(params)
    g_leaves = tree.leaves(grads)
    if not p_leaves or tree.structure(grads) != treedef:
        return None
    on_host = not any(is_cupy(p) for p in p_leaves)
    low_leaves = None if low is None else tree.leaves(low)
    if low is not None and tree.structure(low) != treedef:
        return None
    ok = True
    if on_host and (finite is not None or grad_scale is not None):
        # loss scaling on the host: the flag is read now (it also forms grad_scale), a
        # skipped step keeps everything, and a taken one runs on the unscaled gradients
        if finite is None:
            return None
        finite = finite() if callable(finite) else finite
        ok = bool(finite)
        if ok and grad_scale is not None:
            g_leaves, donate_grads = _unscaled(g_leaves, p_leaves, grad_scale), True
    if on_host and ok and any(g.dtype != p.dtype for g, p in zip(g_leaves, p_leaves)):
        return None  # mixed dtypes: the reference's promotions, step by step (same bits)
    if callable(lr) and len({p.dtype for p in p_leaves}) > 1:
        return None  # one step size per launch, in one dtype: the reference rounds per leaf
    *core, sched = state
    hyper = {}
    # the kernel reads and writes the counts through pointers: only for device counters
    table = lr_table(lr, p_leaves[0]) if callable(lr) and is_cupy(sched.count) else None
    if table is not None:  # the kernel reads the step size and advances the count
        new_sched = type(sched)(count=_new_count(sched.count))
        hyper.update(step_table=table, sched_count=sched.count,
                     new_sched_count=new_sched.count)
    elif callable(lr):  # scheduled: the step size is a device scalar, the count advances
        # checked as the reference step checks it, so both paths fail alike
        step = scalar_like(-1.0 * schedule_value("scale_by_learning_rate", lr, sched.count),
                           p_leaves[0])
        if is_cupy(step):
            hyper["step"] = step
        else:  # a plain number (constant_schedule) or a host scalar: passed by value
            hyper["step_const"] = float(step)
        new_sched = type(sched)(count=increment(sched.count))
    else:
        hyper["step_const"], new_sched = -lr, sched
    first = core[0]
    if kind == "adam":
        if on_host or not is_cupy(first.count):
            count = increment(first.count)
            # the kernel reads the count through a pointer: a host count goes to the GPU
            hyper["count"] = count if on_host else namespace(p_leaves[0]).asarray(count)
        else:  # the kernel increments the count (into a new buffer) and uses the new one
            count = _new_count(first.count)
            hyper.update(count=first.count, new_count=count)
        groups = [tree.leaves(first.mu), tree.leaves(first.nu)]
        hyper.update(b1=spec["b1"], b2=spec["b2"], eps=spec["eps"],
                     wd=spec.get("weight_decay", 0.0), decays=_decay_flags(spec, params))
    elif kind == "momentum":
        groups = [tree.leaves(first.trace)]
        hyper.update(decay=spec["momentum"], nesterov=spec["nesterov"])
    else:
        groups = []
    if on_host and not ok:  # a skipped step: the params and moments as they were
        res = (p_leaves, groups, low_leaves)
    elif on_host:
        res = _host_update(kind, p_leaves, g_leaves, groups, donate_grads, **hyper)
        if res is not None and low is not None:  # the compute copy: the new params, cast
            res = (*res, [np.asanyarray(a).astype(b.dtype) for a, b in zip(res[0], low_leaves)])
    else:
        res = backend.multi_tensor_update(kind, p_leaves, g_leaves, groups, finite=finite,
                                          grad_scale=grad_scale, low=low_leaves,
                                          widen_grads=widen_grads,
                                          in_place=not host_sync_allowed(), **hyper)
    if res is None:
        return None
    if finite is not None:  # the counts the kernel did not write keep their old values too
        if kind == "adam" and "new_count" not in hyper:
            count = kept_unless_finite(finite, count, first.count)
        if new_sched is not sched and "new_sched_count" not in hyper:  # a schedule's
            new_sched = type(sched)(count=kept_unless_finite(finite, new_sched.count,
                                                             sched.count))
    new_p, new_groups = res[:2]
    new_params = tree.unflatten(treedef, new_p)
    if kind == "adam":
        mu_def = tree.structure(first.mu)
        core[0] = type(first)(count=count, mu=tree.unflatten(mu_def, new_groups[0]),
                              nu=tree.unflatten(mu_def, new_groups[1]))
    elif kind == "momentum":
        core[0] = type(first)(trace=tree.unflatten(tree.structure(first.trace), new_groups[0]))
    if low is not None:
        return new_params, (*core, new_sched), tree.unflatten(treedef, res[2])
    return new_params, (*core, new_sched)


#: a schedule whose values are flat from at most this many steps on (its ``horizon``) is
#: tabulated on the device once, so a step reads its step size from the table inside the
#: update kernel instead of evaluating the schedule in about ten small kernels.
LR_TABLE_MAX = 2 ** 20
_LR_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # schedule -> tables


def lr_table(lr, leaf):
    """``-lr(count)`` in ``leaf``'s dtype for count = 0 .. horizon, on ``leaf``'s GPU (cached
    per schedule): the same elementwise operations as the step-by-step value, so the same
    numbers. None for NumPy leaves and for schedules without a horizon (see
    ``_schedules.horizon_of``: only the library's own schedules declare one)."""
    horizon = horizon_of(lr)
    if horizon is None or horizon > LR_TABLE_MAX or not is_cupy(leaf):
        return None
    key = (horizon, leaf.dtype.str, leaf.device.id)
    tables = _LR_TABLES.setdefault(lr, {})
    if key not in tables:
        counts = namespace(leaf).arange(horizon + 1, dtype=np.int32)
        tables[key] = scalar_like(-1.0 * lr(counts), leaf)
    return tables[key]


def kept_unless_finite(finite, new, old):
    """``new`` where the step was finite, else ``old``, in ``old``'s dtype, on the flag's
    device (a count kept on the host beside GPU params moves there). ``finite``: a 0-d bool
    array or a function returning one."""
    if new is old:
        return new
    ok = finite() if callable(finite) else finite
    xp = namespace(ok)
    return xp.where(ok, xp.asarray(new), xp.asarray(old)).astype(old.dtype, copy=False)


def _new_count(count):
    """A buffer for the next step count, which the update kernel writes."""
    return namespace(count).empty((), dtype=count.dtype)


#: the host update works through a large leaf in blocks of this many elements: its
#: temporaries are then a block each, not a leaf each (at most two leaf-sized arrays are
#: made per leaf beyond the new state), and the ten or so passes stay in the cache.
HOST_BLOCK = 1 << 17


def _unscaled(grads, params, scale):
    """``g.astype(p.dtype) * scale`` per leaf, as ``mixed_precision._times`` forms it on the
    host (the product in float32 at least; in float16, 1 / 2**25 would be 0)."""
    out = []
    for g, p in zip(grads, params):
        if p.dtype.itemsize >= 4:
            u = np.array(g, dtype=p.dtype, subok=True)  # its own copy (0-d for a scalar)
            np.multiply(u, scale.astype(p.dtype), out=u)
        else:
            u = (g.astype(scale.dtype) * scale).astype(p.dtype)
        out.append(u)
    return out


def _host_update(kind, params, grads, groups, donate_grads, *, step_const=None, count=None,
                 b1=0.0, b2=0.0, eps=0.0, wd=0.0, decays=None, decay=0.0, nesterov=False):
    """The NumPy form of the fused update: the reference transforms' operations in the same
    order (so bit-identical results), written into the new arrays block by block, with
    donated gradients as the buffers of the new params. None (the reference path) when a
    leaf's state is not in its params' dtype."""
    if any(s.dtype != p.dtype for grp in groups for s, p in zip(grp, params)):
        return None
    new_p, new_groups = [], [[] for _ in groups]
    # the new params go into the gradient's own buffer where that buffer can take them (each
    # block of g is read before its block of u is written)
    donate = _donatable(grads, [*params, *(a for grp in groups for a in grp)]) \
        if donate_grads else [False] * len(grads)
    scratch = kind == "adam" or nesterov  # a block's intermediate terms need a buffer
    for k, (p, g) in enumerate(zip(params, grads)):
        if donate[k]:
            u = g
        else:
            u = np.empty(np.shape(p), p.dtype)  # C order: its flat view is itself
        if kind == "adam":
            c1, c2 = bias_corrections(count, p.dtype, b1, b2)
        state = [grp[k] for grp in groups]
        news = [np.empty(np.shape(p), p.dtype) for _ in groups]
        flat = [np.asarray(a).reshape(-1) for a in (p, g, u, *state, *news)]  # np.matrix too
        tmp = np.empty(min(p.size, HOST_BLOCK) if scratch else 0, p.dtype)
        for lo in range(0, p.size, HOST_BLOCK):
            hi = min(lo + HOST_BLOCK, p.size)
            pb, gb, ub, *rest = flat if hi - lo == p.size else (a[lo:hi] for a in flat)
            tb = tmp[:hi - lo]
            if kind == "adam":
                m, v, mu, nu = rest
                np.multiply(gb, 1 - b1, out=mu)
                mu += np.multiply(m, b1, out=tb)
                np.multiply(gb, gb, out=nu)
                nu *= 1 - b2
                nu += np.multiply(v, b2, out=tb)
                np.divide(mu, c1, out=ub)  # the last read of gb was above
                np.divide(nu, c2, out=tb)
                np.sqrt(tb, out=tb)
                tb += eps
                ub /= tb
                if decays is not None and decays[k]:
                    ub += np.multiply(pb, wd, out=tb)
                ub *= step_const
            elif kind == "momentum":
                trace, new_trace = rest
                np.multiply(trace, decay, out=new_trace)
                new_trace += gb
                if nesterov:  # trace * decay + g (addition commutes: the same bits)
                    np.multiply(new_trace, decay, out=tb)
                    np.add(gb, tb, out=ub)
                    ub *= step_const
                else:
                    np.multiply(new_trace, step_const, out=ub)
            else:
                np.multiply(gb, step_const, out=ub)
            ub += pb  # the update times the step size, plus the params: apply_updates
        new_p.append(u)
        for group, new in zip(new_groups, news):
            group.append(new)
    return new_p, new_groups


def _donatable(grads, others) -> list:
    """Which gradients may become the new params' buffers: plain arrays that own their
    memory, C-contiguous and writable, sharing no byte with another gradient, a param or an
    optimizer slot (tied weights can give one buffer and its transpose as two gradients,
    and a caller may pass the params themselves). Sorted byte ranges, one sweep."""
    ok = [type(g) is np.ndarray and g.flags.c_contiguous and g.flags.writeable and
          g.flags.owndata for g in grads]
    spans = sorted((*_byte_bounds(a), i) for i, a in enumerate((*grads, *others))
                   if isinstance(a, np.ndarray) and a.size)
    reach, owner = -1, -1  # the furthest end so far, and its span
    for lo, hi, i in spans:
        if lo < reach:  # overlaps the span that reaches furthest (and any other it overlaps
            for j in (i, owner):  # was marked when that one was swept)
                if j < len(grads):
                    ok[j] = False
        if hi > reach:
            reach, owner = hi, i
    return ok


def _decay_flags(spec, params):
    if spec.get("weight_decay", 0.0) == 0.0:
        return None
    mask = spec.get("mask")
    if mask is None:
        return [True] * len(tree.leaves(params))
    from fuseflow.optim._transforms import _mask_leaves

    return list(_mask_leaves("adamw", mask, params))
