"""Losses as (value, gradient) pairs: ``loss_fn(outputs, targets) -> (loss, doutputs)``.

Each returns the mean loss over the batch (a 0-d array on the outputs' device, so that no
step waits on the GPU) and its gradient w.r.t. the outputs, in the outputs' dtype.
Half-precision outputs are reduced in float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fuseflow import backend
from fuseflow._dtypes import is_float, is_half
from fuseflow._namespace import host_sync_allowed, is_cupy, namespace

__all__ = [
    "LossError",
    "accuracy",
    "mse",
    "sigmoid_binary_cross_entropy",
    "softmax_cross_entropy",
]


class LossError(ValueError):
    """Targets that do not fit the outputs; the message says what was expected and the fix."""


def _acc(x, xp):
    return x.astype(xp.float32) if is_half(x.dtype) else x


# The checks read only shapes and dtypes (host metadata), except the value-range checks
# that ``check=`` turns off; those never read GPU arrays during a graph capture.


def _check_not_empty(name, outputs):
    if outputs.size == 0 and outputs.shape[0]:  # samples, but no values: no batch to skip
        raise LossError(f"{name}: outputs of shape {tuple(outputs.shape)} hold no values per "
                        "sample. Fix: give the last layer at least one output (for classes: "
                        "Dense(classes)).")
    if outputs.size == 0:
        raise LossError(f"{name}: got an empty batch (outputs of shape {tuple(outputs.shape)}): "
                        "the mean over no samples is NaN. Fix: skip empty batches (a slice "
                        "x[i:j] with i >= j is empty).")


def _check_batch(name, outputs, targets):
    if getattr(outputs, "ndim", 0) != 2:
        raise LossError(f"{name}: outputs must be (batch, classes), got shape "
                        f"{getattr(outputs, 'shape', type(outputs).__name__)}. Fix: pass the "
                        "model's outputs for a batch; for one sample, x[i:i+1] rather than "
                        "x[i] (or outputs[None]).")
    shape = getattr(targets, "shape", None)
    if shape is None:
        raise LossError(f"{name}: labels must be an array, got {type(targets).__name__}. Fix: "
                        "np.asarray(labels), on the outputs' device (ff.device_put).")
    if len(shape) == 0:
        raise LossError(f"{name}: labels must hold one class index per sample, shape "
                        f"({outputs.shape[0]},), got a 0-d array. Fix: pass the labels of the "
                        "batch, y[i:j], not one label y[i].")
    if shape[0] != outputs.shape[0]:
        raise LossError(f"{name}: got {outputs.shape[0]} outputs but {shape[0]} labels. Fix: "
                        "pass the labels of the same batch (x[i:j] with y[i:j]).")
    _check_not_empty(name, outputs)


def _check_same_shape(name, what, outputs, targets, fix):
    """Element-wise losses need targets of exactly the outputs' shape: broadcasting would
    silently compare every output with every target."""
    shape = getattr(targets, "shape", None)
    if shape != outputs.shape:
        raise LossError(f"{name}: targets must have the {what} shape {outputs.shape}, got "
                        f"{type(targets).__name__ if shape is None else shape}. Fix: {fix}")


def _check_labels(name, logits, labels):
    """1-D integer class indices, one per row of 2-D logits (shapes and dtype only)."""
    _check_batch(name, logits, labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise LossError(f"{name}: labels must be a 1-D integer array of class "
                        f"indices, got shape {labels.shape} dtype {labels.dtype}. Fix: "
                        "labels.astype(np.int64); for one-hot targets use labels.argmax(1).")


def softmax_cross_entropy(logits, labels, *, check=True, grad_scale=None, grad_dtype=None):
    """Mean cross-entropy of softmax(logits) against integer class labels.

    ``check=False`` skips the label range check (which reads the labels back from the GPU;
    it is skipped by itself while a compiled step is captured). ``grad_scale`` (a 0-d
    float32 array) and ``grad_dtype``: the gradient comes back as
    ``(g * grad_scale).astype(grad_dtype)``, g being the float32 gradient of
    ``logits.astype(float32)``; ``ff.mixed_precision`` asks for its scaled 16-bit loss
    gradient this way, which on the GPU is the same kernel launch as the loss.
    """
    check_softmax_labels(logits, labels, check=check)
    return backend.of(logits, labels, where="softmax_cross_entropy").softmax_cross_entropy(
        logits, labels, grad_scale, grad_dtype)


class _Logits(NamedTuple):
    """The shape of logits not computed yet, for the checks (a fused output layer's)."""
    shape: tuple

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)


def check_softmax_labels(logits, labels, *, check=True):
    """``softmax_cross_entropy``'s checks of the labels against logits (an array, or their
    shape tuple where a fused output layer has not computed them yet): shapes and dtype,
    and, with ``check``, the range of the values."""
    if isinstance(logits, tuple):
        logits = _Logits(logits)
    _check_labels("softmax_cross_entropy", logits, labels)
    n, classes = logits.shape
    if check and n and host_sync_allowed():
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= classes:
            raise LossError(f"softmax_cross_entropy: labels must lie in [0, {classes}) for "
                            f"{classes} logits, got values in [{lo}, {hi}]. Fix: give the last "
                            "Dense as many features as there are classes.")


def _mse_fix(outputs, targets) -> str:
    """The likely fix for targets of another shape: integer labels want one-hot (or a
    classification loss), values of one output per example want a trailing axis."""
    shape, kind = getattr(targets, "shape", None), getattr(getattr(targets, "dtype", None),
                                                           "kind", "")
    if shape is not None and tuple(shape) + (1,) == tuple(outputs.shape):
        return "targets.reshape(-1, 1), one value per example as the outputs have."
    if shape is not None and kind in "iu" and len(shape) == 1 and outputs.ndim == 2:
        return ("for integer class labels use softmax_cross_entropy, or one-hot encode them: "
                f"np.eye({outputs.shape[1]}, dtype=np.float32)[labels].")
    return "targets of the outputs' shape, on the outputs' device."


def mse(outputs, targets):
    """Mean over all elements of ``(outputs - targets) ** 2``."""
    xp = namespace(outputs)
    _check_same_shape("mse", "outputs'", outputs, targets, _mse_fix(outputs, targets))
    _check_not_empty("mse", outputs)
    diff = _acc(outputs, xp) - targets
    return (diff * diff).mean(), (2.0 * diff / diff.size).astype(outputs.dtype, copy=False)


def sigmoid_binary_cross_entropy(logits, targets, *, check=True):
    """Mean binary cross-entropy of sigmoid(logits) against targets in [0, 1] (same shape).

    Targets outside [0, 1] give a meaningless (possibly negative) loss. Host (NumPy)
    targets are checked for that unless ``check=False``; GPU targets are not (their
    values would have to be read back, which the GPU loss path never does).
    """
    name = "sigmoid_binary_cross_entropy"
    xp = namespace(logits)
    _check_same_shape(name, "logits'", logits, targets,
                      "an array with one target per logit; with one logit per sample, "
                      "(batch, 1), pass targets.reshape(-1, 1). For class indices use "
                      "softmax_cross_entropy.")
    if not (targets.dtype.kind in "biu" or is_float(targets.dtype)):
        raise LossError(f"{name}: targets must be real numbers in [0, 1], got dtype "
                        f"{targets.dtype}. Fix: targets.astype(np.float32).")
    _check_not_empty(name, logits)
    if check and not is_cupy(targets) and host_sync_allowed():
        lo, hi = targets.min(), targets.max()
        if not (lo >= 0 and hi <= 1):  # NaN fails too
            raise LossError(f"{name}: targets must lie in [0, 1] (probabilities of the "
                            f"positive class), got values in [{lo}, {hi}]. Fix: binary labels "
                            "as 0/1 (e.g. (y == positive).astype(np.float32)); for class "
                            "indices use softmax_cross_entropy.")
    x = _acc(logits, xp)
    t = targets.astype(x.dtype)
    e = xp.exp(-xp.abs(x))  # in (0, 1]: neither the loss nor the sigmoid overflows
    loss = (xp.maximum(x, 0) - x * t + xp.log1p(e)).mean()
    sig = xp.where(x >= 0, 1.0, e) / (1.0 + e)
    return loss, ((sig - t) / x.size).astype(logits.dtype, copy=False)


def accuracy(logits, labels):
    """Fraction of rows whose arg-max equals the label (a 0-d array)."""
    _check_labels("accuracy", logits, labels)
    backend.of(logits, labels, where="accuracy")  # host and GPU arrays mixed: a clear error
    return (logits.argmax(axis=1) == labels).mean()
