"""Mixed precision: 16-bit compute, float32 master weights, dynamic loss scaling.

The params (and optimizer state) stay float32. Each step casts them to the compute dtype,
runs forward and backward there (on the GPU: half-precision cuBLASLt epilogs with float32
accumulation), computes the loss in float32, and multiplies the loss gradient by a loss
scale before it is cast down, so small gradients do not flush to zero in float16. The
float32 gradients are divided by the scale again. The compute dtype is float16 (the
default) or bfloat16 (float32's exponent range with 8 bits of mantissa: gradients rarely
leave its range, so the loss scale seldom moves; the same wrapper serves both).

``dynamic_loss_scaling(optimizer)`` wraps any optimizer: when a gradient is inf/nan the
step is skipped (params and the inner state unchanged) and the scale halves; after
``growth_interval`` good steps in a row it doubles. It is written without host branches
(``where`` on 0-d arrays), so the whole step can be captured in a CUDA graph.

    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3))
    grad_fn = ff.mixed_precision.value_and_grad(model, ff.losses.softmax_cross_entropy)
    loss, grads = grad_fn(params, x, y, loss_scale=opt_state.scale)
    updates, opt_state = opt.update(grads, opt_state, params)

A training step can leave the gradients scaled and in 16 bits (``unscaled=False``) and let
``update_and_apply_scaled`` divide them inside the finiteness check and the optimizer's
kernel: on the GPU the float32 gradients are then never written, and the check's kernel
forms ``1 / scale`` for the update (``ff.train.make_step`` does this).

``dynamic_loss_scaling(opt, compute_dtype="float16")`` also keeps the compute copy of the
params in its state (``compute_params``, equal to ``params.astype(float16)`` after every
update): the fused update kernel writes it beside the float32 params, and
``value_and_grad(...)(..., compute_params=state.compute_params)`` uses it instead of
casting the params again at the start of the next step (on the GPU: one fewer read of the
float32 params per step). The copy follows the params through this optimizer's updates
only: the wrapper must be the outermost transform (its updates are the ones applied), and
params changed any other way (loaded weights, averaging) need
``refresh_compute_params(state, params)``.

``compute_copy(opt, "bfloat16")`` is bfloat16 without loss scaling (as PyTorch's autocast
and JAX train it): no finiteness check and no skipped steps, the same compute copy, and the
16-bit gradients (``value_and_grad(..., unscaled=False)`` at scale 1) read by the update.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from fuseflow import backend, tree
from fuseflow._dtypes import bfloat16, is_half
from fuseflow._namespace import is_array, is_cupy, namespace
from fuseflow.grad import _backward, _own_residuals, fused_loss_check, loss_and_output_grad
from fuseflow.optim import GradientTransformation, apply_updates
from fuseflow.optim._base import (_is_float_array, _widens, check_float_updates, check_like,
                                  check_number, check_state, own_attribute, zero_count)
from fuseflow.optim._fused import fused_update, kept_unless_finite, update_and_apply

__all__ = [
    "COMPUTE_DTYPES",
    "ComputeCopyState",
    "DynamicScaleState",
    "all_finite",
    "compute_copy",
    "dynamic_loss_scaling",
    "refresh_compute_params",
    "unscale",
    "update_and_apply_scaled",
    "value_and_grad",
]

COMPUTE_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": bfloat16,
                  "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _compute_dtype(dtype):
    try:
        name = "None" if dtype is None else np.dtype(dtype).name  # np.dtype(None) is float64
    except TypeError:  # say what it may be, not "data type not understood"
        name = str(dtype)
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"mixed precision: compute dtype must be one of {sorted(COMPUTE_DTYPES)}, "
                         f"got {name}. Fix: compute_dtype='bfloat16' or 'float16'")
    return COMPUTE_DTYPES[name]


def value_and_grad(model, loss_fn, compute_dtype="float16", *, with_outputs=False,
                   unscaled=True):
    """``f(params, x, y, *, loss_scale=1.0, key=None, compute_params=None) -> (loss, grads)``
    in 16-bit compute.

    ``grads`` are in the params' dtype (float32), unscaled, and may hold inf/nan after an
    overflow (the ``dynamic_loss_scaling`` optimizer wrapper skips such steps). The loss
    is computed in float32 (float64 where the compute dtype is float64). ``unscaled=False``: the
    grads as the backward made them, in the compute dtype and multiplied by ``loss_scale``
    (for ``update_and_apply_scaled``, or ``unscale``). ``compute_params``: the params
    already cast to the compute dtype (``DynamicScaleState.compute_params``); the forward
    then runs on them and only the batch is cast.
    """
    cd = _compute_dtype(compute_dtype)
    scales_grad = _takes_grad_scale(loss_fn)
    # the output layer and the loss as one operation (see ff.value_and_grad), where the
    # loss would get the scaled 16-bit logits anyway
    check = fused_loss_check(model, loss_fn) if is_half(cd) else None

    def f(params, x, y, *, loss_scale=1.0, key=None, compute_params=None):
        leaves, treedef = tree.flatten(params)
        _check_float_params(params, leaves)
        _check_loss_scale("mixed precision value_and_grad", loss_scale)
        if compute_params is not None:
            low = _checked_compute_params(compute_params, treedef, leaves, cd)
            # the vectorized cast kernel: CuPy's astype took 31 us for the large model's
            # batch on the H200, the multi-tensor cast about a third of that
            x_low = backend.multi_tensor_cast([x], cd)[0] if x.dtype != cd else x
        else:
            # the batch joins the params' cast (one launch on the GPU) where it can
            with_x = x.dtype != cd and backend.fusable([*leaves, x])
            cast = backend.multi_tensor_cast([*leaves, x] if with_x else leaves, cd)
            low = tree.unflatten(treedef, cast[:len(leaves)])
            x_low = cast[-1] if with_x else x.astype(cd, copy=False)
        xp = namespace(x_low)
        scale = xp.asarray(loss_scale, dtype=xp.float32)
        if check is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                (loss, out), grads = model.softmax_xent_and_grad(
                    low, x_low, y, key=key, grad_scale=scale, grad_dtype=cd, check=check)
        else:
            out, residuals = model.forward(low, x_low, key=key, train=True)
            owned = _own_residuals(model, residuals)
            del residuals  # a Serial backward frees each layer's saved arrays once used
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is detected
                if scales_grad and is_half(out.dtype):  # one launch: loss, scaled grad
                    loss, dlow = loss_and_output_grad(loss_fn, out, y, grad_scale=scale,
                                                      grad_dtype=cd)
                else:
                    # float32 at least: float64 compute keeps its precision
                    wide = np.promote_types(out.dtype, np.float32)
                    loss, dout = loss_and_output_grad(loss_fn, out.astype(wide), y)
                    dlow = (dout * scale).astype(cd)
                grads, _ = _backward(model, low, owned, dlow, need_input_grad=False)
        if unscaled:
            grads = _times(grads, params, _inverse(scale, scale)) if leaves else grads
        return ((loss, out) if with_outputs else loss), grads
    return f


def _check_float_params(params, leaves):
    """Every params leaf is a floating-point array: the forward runs on a float cast of the
    params, so a layer never sees an integer param, and its gradient, cast back to the
    param's dtype, would silently be 0."""
    if all(map(_is_float_array, leaves)):
        return
    for path, p in zip(tree.paths(params), leaves):
        if not _is_float_array(p):
            got = p.dtype if hasattr(p, "dtype") else type(p).__name__
            raise TypeError(
                f"mixed precision value_and_grad: the params at {path!r} are {got}, but only "
                f"floating-point params can be trained (the gradient, cast back to {got}, "
                f"would be 0). Fix: ff.tree.astype(params, np.float32)")


def _check_loss_scale(where, loss_scale):
    """``loss_scale`` is a finite number > 0 (in float32) or a 0-d array: None would become
    NaN and every gradient with it. Only a host value is read; a GPU array's shape and
    dtype are checked (a CUDA graph may capture this)."""
    fix = ("Fix: loss_scale=opt_state.scale (the state of "
           "ff.mixed_precision.dynamic_loss_scaling(opt)), or a number such as 1024.0")
    if is_array(loss_scale):
        if loss_scale.shape != () or loss_scale.dtype.kind not in "fiu":
            raise TypeError(f"{where}: loss_scale must be a number or a 0-d array, got an "
                            f"array of shape {tuple(loss_scale.shape)} and dtype "
                            f"{loss_scale.dtype}. {fix}")
        if is_cupy(loss_scale):
            return
    elif not isinstance(loss_scale, numbers.Real) or isinstance(loss_scale, bool):
        raise TypeError(f"{where}: loss_scale must be a number or a 0-d array, got "
                        f"{type(loss_scale).__name__} {loss_scale!r}. {fix}")
    try:
        value = float(loss_scale)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not (0 < value <= _FLOAT32_MAX and np.float32(value) > 0):  # NaN fails too
        raise ValueError(f"{where}: loss_scale must be a finite number > 0 (a float32), got "
                         f"{loss_scale!r}. {fix}")


def _checked_compute_params(compute_params, treedef, leaves, cd):
    got, got_def = tree.flatten(compute_params)
    if got_def != treedef or any(g.dtype != cd or g.shape != p.shape
                                 for g, p in zip(got, leaves)):
        raise ValueError(
            f"mixed precision value_and_grad: compute_params must be the params cast to "
            f"{cd.name} (same structure and shapes), got structure {got_def} with dtypes "
            f"{sorted({g.dtype.name for g in got})} for params {treedef}. Fix: pass "
            f"opt_state.compute_params of ff.mixed_precision.dynamic_loss_scaling(opt, "
            f"compute_dtype='{cd.name}'), or leave compute_params out.")
    return compute_params


def _takes_grad_scale(loss_fn) -> bool:
    """The loss can return its gradient scaled and cast (``grad_scale``, ``grad_dtype``
    keywords, as ``ff.losses.softmax_cross_entropy``): then it computes the float32 loss
    from 16-bit outputs itself, and no separate cast, multiply and cast run."""
    try:
        params = inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False
    return "grad_scale" in params and "grad_dtype" in params


def unscale(grads, params, loss_scale):
    """``grads / loss_scale`` in the params' dtypes: ``g.astype(p.dtype) * (1 / loss_scale)``,
    one launch on the GPU."""
    _check_loss_scale("unscale", loss_scale)
    check_like("unscale", grads, params, "params")
    leaves = tree.leaves(params)
    return _times(grads, params, _inverse(loss_scale, leaves[0])) if leaves else grads


def _inverse(loss_scale, like):
    xp = namespace(like)
    return 1.0 / xp.asarray(loss_scale, dtype=xp.float32)


def _times(grads, params, inv):
    """``g.astype(p.dtype) * inv`` for every leaf (one launch on the GPU), the product in
    float32 at least, as the GPU kernel forms it (in float16, 1 / 2**25 is 0)."""
    leaves, treedef = tree.flatten(params)
    if tree.structure(grads) != treedef:  # unflattened below into the params' structure
        check_like("update_and_apply_scaled", grads, params, "params")
    dtypes = {p.dtype for p in leaves}
    if len(dtypes) == 1 and leaves[0].dtype.itemsize >= 4:
        out = backend.multi_tensor_cast(tree.leaves(grads), dtypes.pop(), inv)
    else:
        out = [g.astype(p.dtype) * inv.astype(p.dtype) if p.dtype.itemsize >= 4 else
               (g.astype(inv.dtype) * inv).astype(p.dtype)
               for g, p in zip(tree.leaves(grads), leaves)]
    # NumPy's 0-d arithmetic gives scalars: a 0-d param's gradient stays a 0-d array
    return tree.unflatten(treedef, [np.asarray(a) if isinstance(a, np.generic) else a
                                    for a in out])


def update_and_apply_scaled(optimizer, grads, opt_state, params):
    """``ff.optim.update_and_apply`` for 16-bit gradients still multiplied by the loss scale
    (``value_and_grad(..., unscaled=False)``); ``optimizer`` is a ``dynamic_loss_scaling``
    wrapper and ``opt_state`` its state. On the GPU, for the fused optimizers, the
    unscaling happens inside the finiteness check and the update kernel (two reads of the
    16-bit gradients instead of writing and reading them twice in float32); the results are
    those of ``unscale`` followed by ``update_and_apply``, bit for bit."""
    scale = getattr(opt_state, "scale", None)
    if scale is None:
        raise TypeError("update_and_apply_scaled: the optimizer state has no loss scale "
                        f"(got a {type(opt_state).__name__}). Fix: wrap the optimizer, "
                        "ff.mixed_precision.dynamic_loss_scaling(opt), before init.")
    hook = own_attribute(optimizer.update, "fused_apply")  # not one a wrapper copied
    if _wider(grads, params):  # float64 compute on float32 params: unscale to their dtype
        hook = None           # first, so the optimizer's state never sees the wide grads
    out = None if hook is None else hook(grads, opt_state, params, loss_scale=scale)
    if out is not None:
        return out
    return update_and_apply(optimizer, _times(grads, params, _inverse(scale, scale)),
                            opt_state, params, donate_grads=True)


def _wider(grads, params) -> bool:
    """Some gradient leaf has a wider dtype than its param."""
    return any(_widens(g, p) for g, p in zip(tree.leaves(grads), tree.leaves(params)))


def all_finite(grads):
    """A 0-d bool array: every element of every leaf is finite (one launch on the GPU);
    True for a tree without leaves (on the host: there is no device to ask)."""
    leaves = tree.leaves(grads)
    return backend.all_finite(leaves) if leaves else np.asarray(True)


class DynamicScaleState(NamedTuple):
    scale: Any        # 0-d float32: the current loss scale
    good_steps: Any   # 0-d int32: finite steps since the last change
    inner: Any        # the wrapped optimizer's state
    #: the params cast to the compute dtype, kept current by every update (or None)
    compute_params: Any = None


def refresh_compute_params(state, params):
    """``state`` with its compute copy re-cast from ``params``: after params were changed
    outside the optimizer (loaded, averaged, edited), whose updates alone keep it current."""
    if getattr(state, "compute_params", None) is None:
        raise TypeError("refresh_compute_params: the state keeps no compute copy. Fix: "
                        "ff.mixed_precision.dynamic_loss_scaling(opt, compute_dtype='float16') "
                        "or ff.mixed_precision.compute_copy(opt, 'bfloat16').")
    low, low_def = tree.flatten(state.compute_params)
    leaves, treedef = tree.flatten(params)
    # as printed: a state loaded without like has namedtuple classes of its own
    if str(treedef) != str(low_def) or any(getattr(p, "shape", None) != c.shape
                                           for p, c in zip(leaves, low)):
        raise ValueError(
            f"refresh_compute_params: params must have the structure and shapes of the "
            f"compute copy (the params given to init()), got params of structure {treedef} "
            f"and shapes {[getattr(p, 'shape', None) for p in leaves][:8]} for a copy of "
            f"structure {low_def} and shapes {[c.shape for c in low][:8]}. Fix: pass this "
            f"model's params; for another model make a new state, opt.init(params).")
    if not low:  # no params: nothing to cast
        return state
    return state._replace(compute_params=_cast_tree(params, low[0].dtype))


def _cast_tree(params, dtype):
    """``params`` with every leaf cast to ``dtype`` (one launch on the GPU)."""
    return tree.unflatten(tree.structure(params),
                          backend.multi_tensor_cast(tree.leaves(params), dtype))


def dynamic_loss_scaling(optimizer, init_scale=2.0 ** 15, growth_interval=2000,
                         growth_factor=2.0, backoff_factor=0.5, min_scale=1.0, *,
                         compute_dtype=None):
    """Wrap ``optimizer``: skip non-finite steps and adapt the loss scale (see module doc).
    ``compute_dtype`` (e.g. "float16"): also keep ``compute_params``, the params in that
    dtype, rewritten by each update (by the fused update kernel itself on the GPU)."""
    if not isinstance(optimizer, GradientTransformation):
        raise TypeError("dynamic_loss_scaling: expected an optimizer such as ff.optim.adam(1e-3), "
                        f"got {type(optimizer).__name__}")
    init_scale, growth_interval, growth_factor, backoff_factor, min_scale = _checked_rule(
        init_scale, growth_interval, growth_factor, backoff_factor, min_scale)
    cd = None if compute_dtype is None else _compute_dtype(compute_dtype)

    def init(params):
        good_steps = zero_count(params)  # on the params' device (the host for no params)
        xp = namespace(good_steps)
        return DynamicScaleState(xp.asarray(init_scale, xp.float32), good_steps,
                                 optimizer.init(params),
                                 None if cd is None else _cast_tree(params, cd))

    def next_scale(state, finite):
        rule = (growth_interval, growth_factor, backoff_factor, min_scale)
        fused = backend.next_loss_scale(finite, state.scale, state.good_steps, *rule)
        if fused is not None:  # one launch on the GPU instead of ten
            return fused
        xp = namespace(state.scale)
        good = xp.where(finite, state.good_steps + 1, 0).astype(xp.int32, copy=False)
        grow = good >= growth_interval
        with np.errstate(over="ignore"):  # kept only while finite, as PyTorch's scaler:
            grown = state.scale * growth_factor  # an inf scale would skip every step
        grown = xp.where(grown <= _FLOAT32_MAX, grown, state.scale)
        scale = xp.where(finite, xp.where(grow, grown, state.scale),
                         xp.maximum(state.scale * backoff_factor, min_scale))
        return (scale.astype(xp.float32, copy=False),
                xp.where(grow, 0, good).astype(xp.int32, copy=False))

    def keep_if_not(finite, new, old, kept=False):
        """``new`` where ``finite``, else ``old``, in ``old``'s structure: a state loaded
        without ``like`` has namedtuple classes of its own, which the inner update may not
        return (the same names and fields: the same printed structure). ``kept``: ``new``
        already holds the old values where not finite (``fused_update``'s state)."""
        n_leaves, n_def = tree.flatten(new)
        o_leaves, o_def = tree.flatten(old)
        if n_def != o_def and str(n_def) != str(o_def):
            raise ValueError(f"dynamic_loss_scaling: the inner optimizer's update returned a "
                             f"state of structure {n_def}, not that of its input, {o_def}")
        if kept:
            return tree.unflatten(o_def, n_leaves)
        if not all(map(is_array, o_leaves)):  # where() would make it an array: a new type
            path, o = next((p, o) for p, o in zip(tree.paths(old), o_leaves) if not is_array(o))
            raise TypeError(
                f"dynamic_loss_scaling: the inner optimizer's state holds a "
                f"{type(o).__name__} at {path!r}, but a skipped step keeps the old state "
                "leaf by leaf with where(), on arrays. Fix: make it a 0-d array in the "
                "transform's init and update, e.g. xp.asarray(0, xp.int32).")
        return tree.unflatten(o_def, [kept_unless_finite(finite, n, o)
                                      for n, o in zip(n_leaves, o_leaves)])

    def step(grads, state, params):
        """``(updates, new state, new params or None)``: the reference step. With a compute
        copy the new params are formed here, once, for the copy and for the caller."""
        xp = namespace(state.scale)
        finite = all_finite(grads)
        safe = tree.map(lambda g: xp.where(finite, g, 0).astype(g.dtype), grads)
        updates, inner = optimizer.update(safe, state.inner, params)
        updates = tree.map(lambda u: xp.where(finite, u, 0).astype(u.dtype), updates)
        new_params = low = None
        if state.compute_params is not None:  # the params these updates give, cast
            new_params = apply_updates(params, updates)
            low = _cast_tree(new_params, cd)
        return updates, type(state)(*next_scale(state, finite),  # the caller's class
                                    keep_if_not(finite, inner, state.inner), low), new_params

    def update(grads, state, params=None):
        check_state("dynamic_loss_scaling.update", state, DynamicScaleState)
        check_float_updates("dynamic_loss_scaling.update", grads)  # before the where()s
        if state.compute_params is not None and params is None:
            raise TypeError("dynamic_loss_scaling(compute_dtype=...): update needs the params "
                            "to keep compute_params current. Fix: call "
                            "opt.update(grads, state, params).")
        updates, new_state, _ = step(grads, state, params)
        return updates, new_state

    def fused_apply(grads, state, params, loss_scale=None):
        """``update_and_apply``'s one-kernel path: the inner optimizer's fused kernel with a
        device-side skip flag (None when the inner optimizer has no fused form and the
        state keeps no compute copy: the caller then runs update + apply_updates; with a
        copy the reference step runs here, adding the updates once for both).
        ``loss_scale``: the gradients are ``grads.astype(float32) * (1 / loss_scale)``; the
        finiteness check forms that factor for the update kernel (no launch of its own)."""
        inverse = None
        if loss_scale is not None:  # float32 as the kernels read it (a no-op for the state's)
            xp = namespace(loss_scale)
            loss_scale = xp.asarray(loss_scale, dtype=xp.float32)
            inverse = xp.empty((), dtype=xp.float32)  # the check's kernel stores 1 / scale

        @functools.cache
        def finite():  # launched only if the fused kernel runs, and once
            return backend.all_finite(tree.leaves(grads), scale=loss_scale,
                                      inverse_into=inverse)

        check_state("dynamic_loss_scaling.update", state, DynamicScaleState)
        out = fused_update(optimizer, grads, state.inner, params, finite=finite,
                           grad_scale=inverse, low=state.compute_params)
        if out is None:  # finite() has not run: the factor is not formed
            if state.compute_params is None:
                return None
            unscaled = grads if loss_scale is None else \
                _times(grads, params, _inverse(loss_scale, loss_scale))
            _, new_state, new_params = step(unscaled, state, params)
            return new_params, new_state
        new_params, inner, *low = out
        # the fused step kept the old state itself where not finite (no where() here)
        return new_params, type(state)(*next_scale(state, finite()),
                                       keep_if_not(finite(), inner, state.inner, kept=True),
                                       low[0] if low else None)

    update.fused_apply = fused_apply
    return GradientTransformation(init, update)


class ComputeCopyState(NamedTuple):
    inner: Any           # the wrapped optimizer's state
    compute_params: Any  # the params cast to the compute dtype, kept current by every update


def compute_copy(optimizer, compute_dtype="bfloat16"):
    """Wrap ``optimizer`` for 16-bit compute without loss scaling: its state keeps
    ``compute_params``, the params cast to ``compute_dtype``, rewritten by every update (by
    the fused update kernel itself on the GPU), and its update takes the gradients in the
    compute dtype as the backward made them.

    For bfloat16, which has float32's range: its gradients rarely underflow, so PyTorch's
    autocast and JAX train it unscaled. Every step is applied (no finiteness check, no
    scale update: on the GPU three fewer launches than ``dynamic_loss_scaling``). The
    update is the inner optimizer's on the gradients cast to the params' dtype (exact from
    16 bits), bit for bit: ``value_and_grad(..., unscaled=False)`` then this wrapper gives
    the params of ``value_and_grad(...)`` then the plain optimizer.

        opt = ff.mixed_precision.compute_copy(ff.optim.adam(1e-3), "bfloat16")
        grad_fn = ff.mixed_precision.value_and_grad(model, loss, "bfloat16", unscaled=False)
        loss, grads = grad_fn(params, x, y, compute_params=opt_state.compute_params)
        params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)

    As with ``dynamic_loss_scaling(..., compute_dtype=...)``, the wrapper must be the
    outermost transform, and params changed outside it need ``refresh_compute_params``.
    float16 is allowed, but its small gradients flush to zero without a loss scale."""
    if not isinstance(optimizer, GradientTransformation):
        raise TypeError("compute_copy: expected an optimizer such as ff.optim.adam(1e-3), "
                        f"got {type(optimizer).__name__}")
    cd = _compute_dtype(compute_dtype)
    if not is_half(cd):
        raise ValueError(f"compute_copy: compute_dtype must be a 16-bit float (the copy "
                         f"of float32 params it keeps), got {cd.name}. Fix: "
                         "compute_copy(opt, 'bfloat16')")

    def init(params):
        return ComputeCopyState(optimizer.init(params), _cast_tree(params, cd))

    def reference(wide, state, params):
        """``(updates, new params, new state)``: the inner optimizer's update of the
        gradients already in the params' dtypes, and the copy of the params it gives."""
        updates, inner = optimizer.update(wide, state.inner, params)
        new_params = apply_updates(params, updates)
        return updates, new_params, ComputeCopyState(inner, _cast_tree(new_params, cd))

    def update(grads, state, params=None):
        check_state("compute_copy.update", state, ComputeCopyState)
        if params is None:
            raise TypeError("compute_copy: update needs the params to keep compute_params "
                            "current. Fix: call opt.update(grads, state, params).")
        updates, _, new_state = reference(_widened(grads, params)[0], state, params)
        return updates, new_state

    def fused_apply(grads, state, params):
        """``update_and_apply``'s path: the inner optimizer's fused kernel, which on the GPU
        reads the 16-bit gradients as their float32 values and writes the copy beside the
        params (on the host it takes them widened); else the reference step."""
        check_state("compute_copy.update", state, ComputeCopyState)
        low = state.compute_params
        out = fused_update(optimizer, grads, state.inner, params, low=low, widen_grads=True)
        if out is None:
            wide, fresh = _widened(grads, params)
            if fresh:  # fresh arrays: they may become the new params' buffers (one float32
                # copy of the params fewer at the host step's peak)
                out = fused_update(optimizer, wide, state.inner, params, low=low,
                                   donate_grads=True)
            if out is None:
                _, new_params, new_state = reference(wide, state, params)
                return new_params, new_state
        new_params, inner, low = out
        return new_params, ComputeCopyState(inner, low)

    update.fused_apply = fused_apply
    return GradientTransformation(init, update)


def _widened(grads, params):
    """``(wide, fresh)``: ``grads`` with each leaf narrower than its param cast to the
    param's dtype (exact from 16 bits to float32), which the inner optimizer sees, and
    whether every leaf was cast (so every leaf of ``wide`` is a fresh array). The structure,
    shapes and kinds are checked first, with the errors ``update_and_apply`` gives."""
    check_like("compute_copy.update", grads, params, "params")
    g_leaves, treedef = tree.flatten(grads)
    cast = [_widens(p, g) for g, p in zip(g_leaves, tree.leaves(params))]
    if not any(cast):
        return grads, False
    wide = [g.astype(p.dtype) if c else g
            for g, p, c in zip(g_leaves, tree.leaves(params), cast)]
    return tree.unflatten(treedef, wide), all(cast)


def _checked_rule(init_scale, growth_interval, growth_factor, backoff_factor, min_scale):
    """The loss-scale rule, checked: a scale of 0, inf or NaN, or factors that shrink on
    growth or grow on backoff, would skip or waste every step without an error."""
    opt = "dynamic_loss_scaling"
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral):
        raise TypeError(f"{opt}: growth_interval must be an int (good steps before the scale "
                        f"grows), got {type(growth_interval).__name__} {growth_interval!r}. "
                        f"Fix: {opt}(..., growth_interval=2000)")
    if growth_interval < 1:  # a huge one is fine: it never grows
        raise ValueError(f"{opt}: growth_interval must be >= 1, got {growth_interval}. "
                         f"Fix: {opt}(..., growth_interval=2000)")
    min_scale = check_number(opt, "min_scale", min_scale, low=0.0, low_open=True, example=1.0)
    if not np.float32(min_scale) > 0:  # the scale is a float32: 1e-50 would be 0 there
        raise ValueError(f"{opt}: min_scale {min_scale} is 0 in float32, the loss scale's "
                         f"dtype. Fix: {opt}(..., min_scale=1.0)")
    return (check_number(opt, "init_scale", init_scale, low=min_scale,
                         high=_FLOAT32_MAX, example=2.0 ** 15,
                         note=" (at least min_scale; the scale is a float32)"),
            int(growth_interval),
            check_number(opt, "growth_factor", growth_factor, low=1.0, low_open=True,
                         example=2.0),
            check_number(opt, "backoff_factor", backoff_factor, low=0.0, low_open=True,
                         high=1.0, example=0.5),
            min_scale)
