"""One training step as a pure function: ``(params, opt_state, x, y) -> (params, opt_state,
metrics)``.

The step returns its metrics as arrays on the params' device and never reads a value back
to the host: on a GPU the next step can be queued while this one runs, and the whole step
can be captured in one CUDA graph (``ff.compile``). The caller decides when to synchronise
(once per progress-bar update, once per epoch).
"""

from __future__ import annotations

import numpy as np

from fuseflow import losses, mixed_precision, tree
from fuseflow._dtypes import bfloat16, is_float
from fuseflow.grad import value_and_grad
from fuseflow.optim import update_and_apply

__all__ = ["batch_casts", "make_step"]


def make_step(model, loss_fn, optimizer, *, compute_dtype=None, comm=None):
    """``step(params, opt_state, x, y, key=None) -> (params, opt_state, metrics)``.

    ``metrics`` is ``{"loss": ..., "accuracy": ...}`` (0-d arrays); accuracy is there when
    ``y`` holds integer class labels. ``key`` reaches layers that draw random numbers.
    The update is ``ff.optim.update_and_apply`` (one fused kernel on the GPU for the named
    optimizers). ``compute_dtype="float16"`` is mixed precision: float32 params, 16-bit
    forward and backward, and an ``optimizer`` wrapped in
    ``ff.mixed_precision.dynamic_loss_scaling`` (its state carries the loss scale, and with
    ``compute_dtype`` the 16-bit copy of the params that the step computes with).
    ``compute_dtype="bfloat16"`` takes the same wrapper, or none: bfloat16 has float32's
    range, and without the wrapper the step runs unscaled and applies every update. Its
    fastest form is ``ff.mixed_precision.compute_copy(opt, "bfloat16")``: unscaled, with
    the 16-bit gradients going straight into the update, which also keeps the params'
    bfloat16 copy for the next step's forward.
    ``comm`` (a ``ff.distributed.Communicator``): x and y are this rank's shard, and the
    gradients are averaged over the ranks (one collective) before the update.
    """
    _check_parts(model, loss_fn, optimizer)
    if compute_dtype is not None:  # checked here: bfloat16 is named, not "not understood"
        compute_dtype = mixed_precision._compute_dtype(compute_dtype)
    mixed = compute_dtype is not None and compute_dtype != np.float32
    # Mixed precision on one device leaves the grads scaled and 16-bit: the update unscales
    # them inside its kernels. Averaging over ranks needs them unscaled (float32) first.
    scaled = mixed and comm is None
    if mixed:
        grad_fn = mixed_precision.value_and_grad(model, loss_fn, compute_dtype,
                                                 with_outputs=True, unscaled=not scaled)
    else:
        grad_fn = value_and_grad(model, loss_fn, with_outputs=True)
    # bfloat16 without loss scaling: float32 gradients of the unscaled loss, as float32 does
    unscaled_fn = mixed_precision.value_and_grad(
        model, loss_fn, compute_dtype, with_outputs=True) if compute_dtype == bfloat16 else None

    fresh_grads = _own_layers_only(model)

    def step(params, opt_state, x, y, key=None):
        scale = getattr(opt_state, "scale", None) if mixed else None
        low = getattr(opt_state, "compute_params", None) if mixed else None
        # bfloat16 with a plain optimizer: float32 gradients of the unscaled loss
        unscaled = mixed and scale is None and low is None and unscaled_fn is not None
        if unscaled:
            (loss, outputs), grads = unscaled_fn(params, x, y, key=key)
        elif mixed:
            if scale is None and low is None:
                raise TypeError(
                    f"make_step(compute_dtype={compute_dtype.name!r}): the optimizer "
                    f"state is a {type(opt_state).__name__}, with no loss scale. Fix: wrap the "
                    "optimizer, ff.mixed_precision.dynamic_loss_scaling(opt), before init "
                    "(or compute in bfloat16, which needs none).")
            low_dtype = next((a.dtype for a in tree.leaves(low)), compute_dtype)
            if low_dtype != compute_dtype:  # a copy without leaves (no params) is any dtype
                raise TypeError(
                    f"make_step(compute_dtype={compute_dtype.name!r}): the optimizer "
                    f"keeps its compute copy in {low_dtype.name}. Fix: the same "
                    "dtype in both, dynamic_loss_scaling(opt, compute_dtype=...) or "
                    "compute_copy(opt, compute_dtype).")
            # compute_copy's state has no scale: its 16-bit grads are those of scale 1
            (loss, outputs), grads = grad_fn(params, x, y, key=key,
                                             loss_scale=1.0 if scale is None else scale,
                                             compute_params=low)
        else:
            (loss, outputs), grads = grad_fn(params, x, y, key=key)
        if comm is not None:
            grads = comm.allreduce_mean(grads)
        # The grads never leave this function: the update may reuse their buffers, where
        # no layer keeps them.
        if scaled and scale is not None:
            params, opt_state = mixed_precision.update_and_apply_scaled(
                optimizer, grads, opt_state, params)
        else:
            params, opt_state = update_and_apply(optimizer, grads, opt_state, params,
                                                 donate_grads=fresh_grads)
        return params, opt_state, _metrics(loss, outputs, y)

    return step


def _metrics(loss, outputs, y):
    metrics = {"loss": loss}
    if is_class_labels(y) and getattr(outputs, "ndim", 0) == 2:
        metrics["accuracy"] = losses.accuracy(outputs, y)
    return metrics


def batch_casts(compute_dtype, x, argnum):
    """``ff.compile``'s ``cast_args`` for a ``make_step`` step whose batch is argument
    ``argnum``: with mixed precision the step casts a floating-point batch to the compute
    dtype first thing, so the compiled graph's copy of the batch casts it instead (one pass
    over the batch, not two). None where the step uses the batch as given."""
    if compute_dtype is None or getattr(x, "dtype", None) is None or not is_float(x.dtype):
        return None
    cd = mixed_precision._compute_dtype(compute_dtype)
    return {argnum: cd} if cd != np.float32 else None


def _own_layers_only(model) -> bool:
    """Every layer of ``model`` is one of fuseflow's own, whose backward returns new arrays
    that it keeps no reference to. A layer of the user's may keep a gradient buffer and
    refill it each step: were it donated to the update, it would become the new params."""
    own = type(model).__module__.startswith("fuseflow.")
    layers = getattr(model, "layers", None)
    return own and (layers is None or all(_own_layers_only(layer) for layer in layers))


def _check_parts(model, loss_fn, optimizer):
    """Arguments in another order, or of another kind, fail here, not at the first step."""
    order = "Fix: make_step(model, loss_fn, optimizer), in that order."
    if not (hasattr(model, "forward") and hasattr(model, "backward")):
        raise TypeError(f"make_step: model must be a layer with forward and backward (such as "
                        f"nn.Serial), got {type(model).__name__}. {order}")
    if not callable(loss_fn) or _is_optimizer(loss_fn):
        raise TypeError(f"make_step: loss_fn must be a loss function such as "
                        f"ff.losses.softmax_cross_entropy, got {type(loss_fn).__name__}. {order}")
    if not _is_optimizer(optimizer):
        raise TypeError(f"make_step: optimizer must have init and update, like "
                        f"ff.optim.adam(1e-3), got {type(optimizer).__name__}. {order}")


def _is_optimizer(obj) -> bool:
    """Duck-typed, as ``update_and_apply`` is: anything with ``init`` and ``update``."""
    return callable(getattr(obj, "init", None)) and callable(getattr(obj, "update", None))


def is_class_labels(y) -> bool:
    return getattr(y, "ndim", 0) == 1 and y.dtype.kind in "iu"
