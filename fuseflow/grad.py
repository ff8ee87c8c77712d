"""Gradients of a model: ``value_and_grad`` and the public gradient checker ``check_grads``."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import optree

from fuseflow import backend, losses, random, tree
from fuseflow._dtypes import is_float
from fuseflow.nn._layer import returned_pair

__all__ = ["GradCheckReport", "GradientCheckError", "check_grads", "loss_and_output_grad",
           "value_and_grad"]


def _releases_residuals(model) -> bool:
    """The model's backward takes ``release_residuals`` (Serial does; a subclass that
    overrides backward without it does not). Looked up once per model class."""
    return bool(getattr(model, "releases_residuals", False)) and \
        _backward_takes_release(type(model))


@functools.cache
def _backward_takes_release(cls) -> bool:
    try:
        return "release_residuals" in inspect.signature(cls.backward).parameters
    except (TypeError, ValueError):  # no introspectable signature: do not ask for it
        return False


def _own_residuals(model, residuals):
    """What value_and_grad hands to the backward: a list it gives up (so the backward can
    free each layer's saved arrays once used) where the model supports that, else the
    residuals exactly as the forward returned them."""
    if _releases_residuals(model) and isinstance(residuals, (tuple, list)):
        return list(residuals)
    return residuals


def _backward(model, params, residuals, dy, need_input_grad):
    """``model.backward`` with the options the model supports; ``residuals`` from
    ``_own_residuals`` (a list is released as the backward goes)."""
    kwargs = {}
    if getattr(model, "skips_input_grad", False):
        kwargs["need_input_grad"] = need_input_grad
    if isinstance(residuals, list) and _releases_residuals(model):
        kwargs["release_residuals"] = True
    return returned_pair(model, "backward", model.backward(params, residuals, dy, **kwargs))


def loss_and_output_grad(loss_fn, out, y, *, same_dtype=False, **kwargs):
    """``loss_fn(out, y, **kwargs)``, checked against the loss contract: it returns
    ``(loss, d loss / d out)`` with the gradient shaped like ``out`` (what the backward
    starts from; a loss that returns only the value cannot be differentiated here), and
    with ``same_dtype`` an array of ``out``'s kind and dtype (else the output layer would
    reject it as a ``dy`` the user never passed)."""
    result = loss_fn(out, y, **kwargs)
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    if not (isinstance(result, tuple) and len(result) == 2):
        got = (f"a tuple of {len(result)}" if isinstance(result, tuple)
               else type(result).__name__)
        raise TypeError(f"value_and_grad: the loss {name} must return (loss, d_loss/d_outputs), "
                        f"got {got}. Fix: return the gradient with respect to the model's "
                        "outputs too, as ff.losses.softmax_cross_entropy does "
                        "(docs/concepts.md, 'Losses').")
    shape = getattr(result[1], "shape", None)
    if shape is None or tuple(shape) != tuple(out.shape):
        got = tuple(shape) if shape is not None else type(result[1]).__name__
        raise ValueError(f"value_and_grad: the loss {name} returned a gradient of shape {got} "
                         f"for outputs of shape {tuple(out.shape)}. Fix: return "
                         "d_loss/d_outputs, one entry per output.")
    grad = result[1]
    if same_dtype and (type(grad) is not type(out) or grad.dtype != out.dtype):
        got = (f"dtype {grad.dtype}" if type(grad) is type(out)
               else f"a {type(grad).__module__}.{type(grad).__name__}")
        raise TypeError(f"value_and_grad: the loss {name} returned a gradient of {got} for "
                        f"outputs of dtype {out.dtype} ({type(out).__module__}."
                        f"{type(out).__name__}); the backward starts from it as they are. "
                        "Fix: compute the loss on targets of the outputs' dtype "
                        "(targets.astype(outputs.dtype)), or return the gradient so: "
                        "grad.astype(outputs.dtype), on the outputs' array module.")
    return result


def fused_loss_check(model, loss_fn):
    """Whether the model runs ``loss_fn`` together with its output layer, as the ``check``
    setting to run it with (None: it does not). Fused: ``ff.losses.softmax_cross_entropy``
    itself, or a ``functools.partial`` of it that sets ``check`` only, with a ``Serial``
    whose last layer is a plain Dense (``Serial.softmax_head``)."""
    if getattr(model, "softmax_head", None) is None:
        return None
    if loss_fn is losses.softmax_cross_entropy:
        return True
    if isinstance(loss_fn, functools.partial) and loss_fn.func is losses.softmax_cross_entropy \
            and not loss_fn.args and set(loss_fn.keywords) <= {"check"}:
        return bool(loss_fn.keywords.get("check", True))
    return None


def value_and_grad(model, loss_fn, *, with_outputs=False):
    """``f(params, x, y, *, key=None) -> (loss, grads)`` for ``loss_fn(model(x), y)``.

    One forward, one loss, one backward; the input gradient of the first layer is not
    computed. With ``with_outputs=True`` it returns ``((loss, outputs), grads)`` so metrics
    such as accuracy need no second forward. A ``Serial`` ending in a plain Dense with
    ``ff.losses.softmax_cross_entropy`` runs its output layer and the loss as one operation
    (``Serial.softmax_xent_and_grad``; on the GPU one kernel for short batches).
    """
    check = fused_loss_check(model, loss_fn)

    def f(params, x, y, *, key=None):
        if check is not None:
            (loss, out), grads = model.softmax_xent_and_grad(params, x, y, key=key,
                                                             check=check)
        else:
            out, residuals = returned_pair(model, "forward",
                                           model.forward(params, x, key=key, train=True))
            loss, dout = loss_and_output_grad(loss_fn, out, y, same_dtype=True)
            owned = _own_residuals(model, residuals)
            del residuals  # a Serial backward frees each layer's saved arrays once used
            grads, _ = _backward(model, params, owned, dout, need_input_grad=False)
        return ((loss, out) if with_outputs else loss), grads
    return f


class GradientCheckError(AssertionError):
    """A layer's backward disagrees with finite differences."""


class GradCheckReport:
    def __init__(self, worst, checked):
        self.worst, self.checked = worst, checked  # worst: (error, where, index, analytic, numeric)

    @property
    def max_error(self):
        return self.worst[0]

    def __str__(self):
        err, where, idx, a, n = self.worst
        return (f"checked {self.checked} elements; worst at {where}[{idx}]: backward {a:.10g}, "
                f"finite differences {n:.10g}, error {err:.3g}")


def _check_like(layer, what, grad, of, value):
    """``grad`` has the shape of ``value`` and is float64 (check_grads' dtype): otherwise the
    comparison would fail with an IndexError or a TypeError that names neither."""
    a = np.asarray(grad)  # host arrays here; a float is fine for a 0-d leaf
    fix = f"Fix: return the gradient with respect to {of} in {of}'s shape" + (
        " (a parameter broadcast over the batch: sum its gradient over axis 0, without "
        "keepdims)." if of.startswith("params") else ".")
    if a.shape != value.shape:
        raise GradientCheckError(f"{layer!r}: backward's {what} has shape {a.shape} but {of} has "
                                 f"{value.shape}. {fix}")
    if a.dtype != value.dtype:
        raise GradientCheckError(f"{layer!r}: backward's {what} has dtype {a.dtype} but {of} is "
                                 f"{value.dtype} (check_grads runs in float64). Fix: compute in "
                                 "the dtype of the inputs, without hard-coded float32 casts.")


#: what a forward or backward raises when its residuals are not the ones it needs (a missing
#: key or entry, a wrong type); ValueError is a LayerError of a layer that checks them
_RESIDUAL_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)


def _same_residuals(layer, params, x, key, residuals) -> bool:
    """Whether a training forward saves residuals of the structure ``residuals`` has; False
    where that forward cannot run as called (Dropout without a key), since then the
    inference residuals are the difference to report."""
    try:
        trained = layer.forward(params, x, key=key, train=True)[1]
    except _RESIDUAL_ERRORS:
        return False
    return tree.structure(residuals) == tree.structure(trained)


def check_grads(layer, params, x, *, key=None, eps=1e-6, rtol=1e-5, atol=1e-8,
                max_checks=64, seed=0, train=True):
    """Check ``layer.backward`` against central finite differences in float64.

    The layer runs in float64 on the host (params and x are cast); a random cotangent ``dy``
    turns the output into the scalar ``sum(y * dy)``. Up to ``max_checks`` elements of every
    params leaf and of x are perturbed by ``eps``. Raises GradientCheckError with the worst
    element (which leaf, which index, both values) when ``|a - n| > atol + rtol * max(|a|,|n|)``;
    returns a GradCheckReport otherwise.
    """
    if isinstance(max_checks, bool) or not isinstance(max_checks, (int, np.integer)) \
            or max_checks < 1:
        raise ValueError(f"check_grads: max_checks must be a whole number >= 1 (the elements "
                         f"checked per leaf), got {max_checks!r}; with none checked nothing "
                         "would be. Fix: leave it at 64, or raise it to check more.")
    np_be = backend.get("numpy")
    for path, a in zip(optree.tree_paths(params), tree.leaves(params)):
        kind = getattr(getattr(a, "dtype", None), "kind", None)
        if not (kind is None or is_float(a.dtype)) or not hasattr(a, "shape"):
            index = "".join(f"[{k!r}]" for k in path)
            got = f"{a.dtype}" if kind else f"a {type(a).__name__}"
            raise GradientCheckError(
                f"{layer!r}: params{index} is {got}: every param is trained, so every param "
                "is a floating-point array. Fix: make it a float array (a 0-d one for a "
                "scalar), or keep a value that is not trained out of the params (a layer "
                "attribute; docs/custom-layers.md)")
    params64 = tree.map(lambda a: np_be.asarray(a).astype(np.float64), params)
    x64 = np_be.asarray(x).astype(np.float64)
    y, residuals = returned_pair(layer, "forward",
                                 layer.forward(params64, x64, key=key, train=train))
    dy = random.normal(random.key(seed), y.shape, np.float64)
    try:
        grads, dx = returned_pair(layer, "backward", layer.backward(params64, residuals, dy))
    except _RESIDUAL_ERRORS as e:
        # the custom-layer guide lets a layer save no residuals in inference: say so only
        # when that is the difference (a bug in backward keeps its own error); ValueError
        # is the LayerError of a backward that checks its residuals (self.error)
        if train or _same_residuals(layer, params64, x64, key, residuals):
            raise
        raise GradientCheckError(
            f"{layer!r}: backward failed on the residuals of forward(..., train=False) "
            f"({type(e).__name__}: {e}); a layer may save none in inference, so its backward "
            "cannot run there. Fix: check_grads(..., train=True), the default") from e
    if tree.structure(grads) != tree.structure(params64):
        raise GradientCheckError(f"{layer!r}: grads structure {tree.structure(grads)} differs "
                                 f"from params structure {tree.structure(params64)}")
    for path, g, p in zip(optree.tree_paths(params64), tree.leaves(grads), tree.leaves(params64)):
        index = "".join(f"[{k!r}]" for k in path)
        _check_like(layer, f"grads{index}", g, f"params{index}", p)
    _check_like(layer, "dx", dx, "x", x64)

    def objective(p, xx):
        return float((layer.forward(p, xx, key=key, train=train)[0] * dy).sum())

    rng = np.random.default_rng(seed)
    leaves, treedef = tree.flatten(params64)
    targets = [(f"params/{path}", j, g) for j, (path, g) in
               enumerate(zip(tree.paths(params64), tree.leaves(grads)))]
    targets.append(("x", None, dx))
    worst, checked = (0.0, "", (), 0.0, 0.0), 0
    for where, j, analytic in targets:
        base = leaves[j] if j is not None else x64
        flat_idx = np.arange(base.size)
        if base.size > max_checks:
            flat_idx = rng.choice(base.size, max_checks, replace=False)
        for fi in flat_idx:
            idx = np.unravel_index(fi, base.shape)
            vals = []
            for sign in (1, -1):
                pert = base.copy()
                pert[idx] += sign * eps
                if j is None:
                    vals.append(objective(params64, pert))
                else:
                    new = list(leaves)
                    new[j] = pert
                    vals.append(objective(tree.unflatten(treedef, new), x64))
            numeric = (vals[0] - vals[1]) / (2 * eps)
            a = float(np.asarray(analytic)[idx])
            err = abs(a - numeric) / (atol + rtol * max(abs(a), abs(numeric)))
            checked += 1
            if err > worst[0]:
                worst = (err, where, tuple(int(i) for i in idx), a, numeric)
    report = GradCheckReport(worst, checked)
    if worst[0] > 1.0:
        raise GradientCheckError(f"{layer!r}: backward disagrees with finite differences: "
                                 f"{report} (error is |a-n| / (atol + rtol*max(|a|,|n|)), "
                                 "must be <= 1)")
    return report
