"""Test-set loss and accuracy of a model: inference forward (``train=False``), in batches.

The accuracy is an exact count of correct rows divided by the number of rows, so the
number printed at the end of training and the one ``fuseflow eval`` prints from the saved
checkpoint are the same number, not merely close.
"""

from __future__ import annotations

from typing import NamedTuple

from fuseflow._namespace import namespace
from fuseflow.nn._layer import infer
from fuseflow.data import batches
from fuseflow.data._batches import _check_batch_size
from fuseflow.train._labels import check_labels, unchecked_cross_entropy

__all__ = ["evaluate", "EvalResult"]


class EvalResult(NamedTuple):
    loss: float            # mean loss over all examples
    accuracy: float | None  # correct / count; None when y are not class labels
    correct: int | None
    count: int


def evaluate(model, params, x, y, batch_size: int = 1000, *, loss_fn=None) -> EvalResult:
    """Mean loss and accuracy of ``model`` on ``(x, y)``, ``batch_size`` rows at a time.

    ``x`` and ``y`` must live on the params' device. ``loss_fn`` defaults to softmax
    cross-entropy (labels are checked once, here, not per batch). Accuracy (argmax against
    the label) is counted only when ``y`` holds integer class labels, as ``make_step``
    reports it; for other targets (one-hot, regression) ``accuracy`` and ``correct`` are
    None. Sums stay on the device; the one read-back to the host is at the end.
    """
    batch_size = _check_batch_size(batch_size, "evaluate")
    if loss_fn is None:
        check_labels(model, params, x, y, "evaluate")
        loss_fn = unchecked_cross_entropy
    if not len(x):
        raise ValueError("evaluate: got 0 examples. Fix: pass a non-empty test set.")
    loss_sum = correct = 0
    labels = getattr(y, "ndim", 0) == 1 and y.dtype.kind in "iu"  # as make_step decides
    for xb, yb in batches(x, y, batch_size, shuffle=False):
        out = infer(model, params, xb)
        loss, _ = loss_fn(out, yb)
        xp = namespace(out)
        loss_sum = loss_sum + loss.astype(xp.float64) * len(xb)
        labels = labels and getattr(out, "ndim", 0) == 2
        if labels:
            correct = correct + (out.argmax(axis=1) == yb).sum()
    count = len(x)
    if not labels:
        return EvalResult(loss=float(loss_sum) / count, accuracy=None, correct=None,
                          count=count)
    correct = int(correct)
    return EvalResult(loss=float(loss_sum) / count, accuracy=correct / count, correct=correct,
                      count=count)
