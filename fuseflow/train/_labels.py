"""Cross-entropy whose label check runs once per data set instead of once per batch.

``softmax_cross_entropy`` checks that labels lie in ``[0, classes)``, which on a GPU reads
the labels back to the host: a synchronisation in every step. Training and evaluation check
each whole label array once, up front, and then use the unchecked loss.
"""

from __future__ import annotations

import functools

from fuseflow import losses
from fuseflow.nn._layer import infer

__all__ = ["check_labels", "unchecked_cross_entropy"]

unchecked_cross_entropy = functools.partial(losses.softmax_cross_entropy, check=False)


def check_labels(model, params, x, y, what="data"):
    """Raise LossError unless ``y`` are integer labels in ``[0, model outputs)`` for ``x``."""
    if len(x) != len(y):
        raise losses.LossError(f"{what}: {len(x)} examples but {len(y)} labels; they must "
                               "match (one label per example)")
    if getattr(y, "ndim", 0) != 1 or y.dtype.kind not in "iu":
        raise losses.LossError(
            f"{what}: labels must be a 1-D integer array of class indices, got shape "
            f"{getattr(y, 'shape', None)} dtype {getattr(y, 'dtype', type(y).__name__)}. "
            "Fix: y.astype(np.int64); for one-hot targets use y.argmax(1).")
    if not len(y):
        return
    try:
        classes = infer(model, params, x[:1]).shape[1]  # the first example, as a probe
    except ValueError as e:  # a layer's shape or dtype check, on a batch of one
        message = f"{what}: x has shape {tuple(x.shape)}; on its first example, x[:1], {e}"
        try:
            error = type(e)(message)  # LayerError stays a LayerError
        except TypeError:
            error = ValueError(message)
        raise error from None
    lo, hi = int(y.min()), int(y.max())
    if lo < 0:
        raise losses.LossError(
            f"{what}: labels lie in [{lo}, {hi}], but class indices start at 0. Fix: "
            "relabel the classes 0..K-1 (e.g. np.unique(y, return_inverse=True)[1]).")
    if hi >= classes:
        raise losses.LossError(
            f"{what}: labels lie in [{lo}, {hi}] but the model has {classes} outputs, so they "
            f"must lie in [0, {classes - 1}]. Fix: give the last Dense "
            f"{hi + 1} features (the number of classes).")

