"""TrainState: everything a training run is, in one pytree, so that a checkpoint of it is a
run that can continue bit for bit.

Nothing random is carried as a generator: the data order of epoch ``e`` is
``permutation(fold_in(data_key, e))`` and the layers' key at step ``s`` (Dropout) is
``fold_in(key, s)`` (folded with the rank too under data parallel). Both follow from the
state's integers and two fixed keys, so a resumed run draws exactly what the uninterrupted
run would have drawn.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fuseflow import random
from fuseflow.nn._layer import returned_pair, shape_tuple

__all__ = ["TrainState", "init_state"]


class TrainState(NamedTuple):
    params: Any          # the model's parameter pytree
    opt_state: Any       # the optimizer's state pytree
    step: int            # optimizer steps taken so far, over all epochs
    epoch: int           # epochs completed; the epoch in progress is ``epoch`` (0-based)
    key: Any             # ff.random key for the layers (Dropout); step s uses fold_in(key, s)
    batch_in_epoch: int  # batches of epoch ``epoch`` already taken (0 at an epoch boundary)
    data_key: Any        # ff.random key of the data order; epoch e uses fold_in(data_key, e)


def init_state(model, optimizer, in_shape, key) -> TrainState:
    """A fresh run: the model initialised from ``key``, the optimizer's initial state.

    ``key`` is split three ways (init, layers, data order), so one seed fixes the whole run.
    ``in_shape`` is one example's shape, ``(784,)`` (an int means a 1-D example).
    """
    init_key, layer_key, data_key = random.split(key, 3)
    shape = shape_tuple(in_shape)
    if shape is None:
        raise TypeError(f"init_state: in_shape must be one example's shape, such as (784,), "
                        f"got {in_shape!r}. Fix: init_state(model, optimizer, (784,), key).")
    _, params = returned_pair(model, "init", model.init(init_key, shape))
    return TrainState(params=params, opt_state=optimizer.init(params), step=0, epoch=0,
                      key=layer_key, batch_in_epoch=0, data_key=data_key)
