"""Optimizers as gradient transformations (the optax model), on NumPy or CuPy pytrees.

The contract, stated once: a ``GradientTransformation(init, update)`` is two pure
functions, ``init(params) -> state`` and ``update(updates, state, params=None) ->
(updates, new_state)``. Optimizers are ``chain``-s of small transforms; a learning rate is
a float or a schedule ``count -> lr``. State holds arrays only (step counts are 0-d int32
arrays on the params' device). A training step::

    opt = ff.optim.adam(1e-3)
    state = opt.init(params)
    updates, state = opt.update(grads, state, params)
    params = ff.optim.apply_updates(params, updates)
"""

from fuseflow.optim._aliases import adam, adamw, sgd
from fuseflow.optim._fused import update_and_apply
from fuseflow.optim._base import EmptyState, GradientTransformation, apply_updates, chain, identity
from fuseflow.optim._schedules import (
    constant_schedule,
    cosine_decay_schedule,
    linear_schedule,
    step_decay_schedule,
    warmup_cosine_decay_schedule,
)
from fuseflow.optim._transforms import (
    ScaleByAdamState,
    ScaleByScheduleState,
    TraceState,
    add_decayed_weights,
    clip_by_global_norm,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_schedule,
    trace,
)

momentum = trace  # the usual name for the building block

__all__ = [
    "EmptyState",
    "GradientTransformation",
    "ScaleByAdamState",
    "ScaleByScheduleState",
    "TraceState",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip_by_global_norm",
    "constant_schedule",
    "cosine_decay_schedule",
    "identity",
    "linear_schedule",
    "momentum",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_schedule",
    "sgd",
    "step_decay_schedule",
    "trace",
    "update_and_apply",
    "warmup_cosine_decay_schedule",
]
