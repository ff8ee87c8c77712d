"""Losses as (value, gradient) pairs: ``loss_fn(outputs, targets) -> (loss, doutputs)``.

Each returns the mean loss over the batch (a 0-d array on the outputs' device, so that no
step waits on the GPU) and its gradient w.r.t. the outputs, in the outputs' dtype.
Half-precision outputs are reduced in float32.
"""

from __future__ import annotations

from fuseflow import backend
from fuseflow._namespace import host_sync_allowed, namespace

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
    return x.astype(xp.float32) if x.dtype == xp.float16 else x


def _check_batch(name, outputs, targets):
    if getattr(outputs, "ndim", 0) != 2:
        raise LossError(f"{name}: outputs must be (batch, classes), got shape "
                        f"{getattr(outputs, 'shape', type(outputs).__name__)}")
    if getattr(targets, "shape", (None,))[0] != outputs.shape[0]:
        raise LossError(f"{name}: got {outputs.shape[0]} outputs but "
                        f"{getattr(targets, 'shape', ['?'])[0]} labels. Fix: pass the labels of "
                        "the same batch (x[i:j] with y[i:j]).")


def softmax_cross_entropy(logits, labels, *, check=True, grad_scale=None, grad_dtype=None):
    """Mean cross-entropy of softmax(logits) against integer class labels.

    ``check=False`` skips the label range check (which reads the labels back from the GPU;
    it is skipped by itself while a compiled step is captured). ``grad_scale`` (a 0-d
    float32 array) and ``grad_dtype``: the gradient comes back as
    ``(g * grad_scale).astype(grad_dtype)``, g being the float32 gradient of
    ``logits.astype(float32)``; ``ff.mixed_precision`` asks for its scaled 16-bit loss
    gradient this way, which on the GPU is the same kernel launch as the loss.
    """
    _check_batch("softmax_cross_entropy", logits, labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise LossError(f"softmax_cross_entropy: labels must be a 1-D integer array of class "
                        f"indices, got shape {labels.shape} dtype {labels.dtype}. Fix: "
                        "labels.astype(np.int64); for one-hot targets use labels.argmax(1).")
    n, classes = logits.shape
    if check and n and host_sync_allowed():
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= classes:
            raise LossError(f"softmax_cross_entropy: labels must lie in [0, {classes}) for "
                            f"{classes} logits, got values in [{lo}, {hi}]. Fix: give the last "
                            "Dense as many features as there are classes.")
    return backend.of(logits, labels, where="softmax_cross_entropy").softmax_cross_entropy(
        logits, labels, grad_scale, grad_dtype)


def mse(outputs, targets):
    """Mean over all elements of ``(outputs - targets) ** 2``."""
    xp = namespace(outputs)
    if getattr(targets, "shape", None) != outputs.shape:
        raise LossError(f"mse: targets must have the outputs' shape {outputs.shape}, got "
                        f"{getattr(targets, 'shape', type(targets).__name__)}")
    diff = _acc(outputs, xp) - targets
    return (diff * diff).mean(), (2.0 * diff / diff.size).astype(outputs.dtype, copy=False)


def sigmoid_binary_cross_entropy(logits, targets):
    """Mean binary cross-entropy of sigmoid(logits) against targets in [0, 1] (same shape)."""
    xp = namespace(logits)
    if getattr(targets, "shape", None) != logits.shape:
        raise LossError(f"sigmoid_binary_cross_entropy: targets must have the logits' shape "
                        f"{logits.shape}, got {getattr(targets, 'shape', type(targets).__name__)}")
    x = _acc(logits, xp)
    t = targets.astype(x.dtype)
    loss = (xp.maximum(x, 0) - x * t + xp.log1p(xp.exp(-xp.abs(x)))).mean()
    sig = 1.0 / (1.0 + xp.exp(-x))
    return loss, ((sig - t) / x.size).astype(logits.dtype, copy=False)


def accuracy(logits, labels):
    """Fraction of rows whose arg-max equals the label (a 0-d array)."""
    return (logits.argmax(axis=1) == labels).mean()
