"""The dense op: one cuBLASLt matmul per direction, with the activation in the epilog.

Forward: ``y = act(x @ w.T + b)`` as one ``linear`` call (RELU_AUX_BIAS, GELU_AUX_BIAS, BIAS,
...), which also writes the mask/pre-activation the backward needs.

Backward, for a layer whose gradient w.r.t. its own pre-activation is ``dpre``:
- weight gradient ``dw = dpre.T @ x``; when the bias gradient is not known yet it comes out
  of the same call (BGRADB);
- input gradient ``dx = dpre @ w``; when the layer BELOW ends in an activation, this call
  applies that activation's derivative and sums its bias gradient (DRELU_BGRAD,
  DGELU_BGRAD). That is the cross-layer fusion: the lower layer then receives its
  ``dpre`` and bias gradient ready-made and runs no mask or reduction step of its own.

Where the backend has one pass for both gradients of a layer (``linear_grads``: on the
GPU, a skinny 16-bit output layer at long batches, by default), they are one call.

An output layer with its softmax cross-entropy (``dense_softmax_xent``) goes one step
further: forward, loss and input gradient are one backend call where the backend fuses
them (``linear_softmax_xent``), or forward, loss and both gradients
(``linear_xent_grads``).
"""

from __future__ import annotations

from fuseflow import backend
from fuseflow.backend.epilogs import AUX_KEYS, dgrad_epilog, forward_epilog
from fuseflow.losses import check_softmax_labels


def dense_forward(params, x, *, activation=None, train=True, where="Dense"):
    """``(y, residuals)``; residuals hold the input and, in training, the activation's aux."""
    w, b = params["w"], params.get("b")
    be = backend.of(x, w, b, where=where)
    y, aux = be.linear(x, w, b, forward_epilog(activation, bias=b is not None, aux=train))
    residuals = {"x": x}
    if aux is not None:
        residuals[AUX_KEYS[activation]] = aux
    return y, residuals


def dense_backward(params, residuals, dy=None, *, activation=None, pre_grad=None,
                   input_activation=None, input_aux=None, input_has_bias=False,
                   need_input_grad=True, release_input=False, overlap_wgrad=False):
    """Gradients of a dense layer: ``(grads, dx, input_bias_grad)``.

    Give either ``dy`` (gradient w.r.t. the layer's output) or ``pre_grad = (dpre, db)``
    (w.r.t. its pre-activation, already computed by the fused layer above; db may be None).
    With ``input_activation``/``input_aux``, ``dx`` is returned w.r.t. the lower layer's
    pre-activation and ``input_bias_grad`` is its bias gradient (when it has a bias).
    ``release_input=True`` (the residuals dict is the caller's to consume) removes the saved
    input from it once the weight gradient is done, so that its memory can hold ``dx``.
    ``overlap_wgrad=True`` (the caller reads the grads only after its
    ``overlapping_wgrad()`` scope ends) lets the weight gradient overlap the input gradient;
    the backend then keeps the input alive until the scope ends, not just until the weight
    gradient is issued.
    """
    w, has_bias = params["w"], "b" in params
    x = residuals.pop("x") if release_input else residuals["x"]
    be = backend.of(x, w, dy, where="Dense.backward")
    if pre_grad is not None:
        dpre, db = pre_grad
    elif activation is not None:
        dpre, db = be.activation_grad(dy, activation, residuals[AUX_KEYS[activation]]), None
    else:
        dpre, db = dy, None

    overlap_wgrad, late = _wgrad_order(be, overlap_wgrad, need_input_grad, dpre, x)
    epilog = dgrad_epilog(input_activation, bgrad=input_has_bias) if need_input_grad else None
    if epilog is not None:
        both = _both_grads(be, dpre, x, w, has_bias, db, epilog, input_aux, overlap_wgrad)
        if both is not None:
            return both
    if not late:
        grads = _weight_grads(be, dpre, x, has_bias, db, overlap_wgrad)
        del x  # the input's last reader ran (with release_input, nothing else holds it now)

    dx = input_db = None
    if epilog is not None:
        dx, input_db = be.linear_dgrad(dpre, w, epilog, input_aux)
    if late:
        grads = _weight_grads(be, dpre, x, has_bias, db, overlap_wgrad)
    return grads, dx, input_db


def _wgrad_order(be, overlap, need_input_grad, dy, x):
    """``(overlap, late)``: with the backend's overlap order "after" an overlapped weight
    gradient is issued after the input gradient (late), so that it runs beside the next
    layer's work; otherwise first ("before", "early": beside the input gradient), so that
    x can be freed before dx is allocated. Under "after" and "early" the lowest layer's (no
    input gradient: nothing follows it on the main stream) runs on the main stream."""
    if overlap and not need_input_grad and be.lowest_wgrad_on_main(dy, x):
        return False, False
    return overlap, overlap and be.wgrad_after_dgrad(dy, x)


def _both_grads(be, dpre, x, w, has_bias, db, epilog, input_aux, overlap):
    """``(grads, dx, input_bias_grad)`` from one backend call where the backend fuses the
    weight and input gradients (``linear_grads``), else None."""
    both = be.linear_grads(dpre, x, w, _wgrad_epilog(has_bias, db), epilog, input_aux,
                           overlap=overlap)
    if both is None:
        return None
    dw, wdb, dx, input_db = both
    return _layer_grads(dw, wdb, has_bias, db), dx, input_db


def _weight_grads(be, dpre, x, has_bias, db, overlap):
    """``{"w": dw, "b": db}`` from the weight-gradient call."""
    dw, wdb = be.linear_wgrad(dpre, x, _wgrad_epilog(has_bias, db), overlap=overlap)
    return _layer_grads(dw, wdb, has_bias, db)


def _wgrad_epilog(has_bias, db):
    """The bias gradient comes from the weight-gradient call (BGRADB) where ``db`` is not
    known yet."""
    return "BGRADB" if has_bias and db is None else "DEFAULT"


def _layer_grads(dw, wdb, has_bias, db):
    """The layer's grads: ``db`` where it was known, else the call's (``wdb``)."""
    return {"w": dw, "b": wdb if db is None else db} if has_bias else {"w": dw}


def dense_softmax_xent(params, residuals, labels, *, input_activation=None, input_aux=None,
                       input_has_bias=False, need_input_grad=True, grad_scale=None,
                       grad_dtype=None, check=True, release_input=False, overlap_wgrad=False):
    """An output layer (no activation) and its softmax cross-entropy, forward and backward:
    ``(loss, logits, grads, dx, input_bias_grad)``.

    The same as ``dense_forward`` on ``residuals["x"]``, ``softmax_cross_entropy(logits,
    labels, check=check, grad_scale=grad_scale, grad_dtype=grad_dtype)`` and
    ``dense_backward`` (see there for the ``input_*``, ``release_input`` and
    ``overlap_wgrad`` options), but where the backend fuses them (``linear_softmax_xent``:
    on the GPU, one kernel for short batches) the logits, the loss and the input gradient
    come from one call. Then only the weight gradient is left, issued after them. Elsewhere
    the logits and the loss may still come from one call (``linear_xent``: on the GPU the
    float16 tensor-core forward at long batches), and the gradients follow as usual.
    """
    w, b = params["w"], params.get("b")
    x = residuals.pop("x") if release_input else residuals["x"]
    be = backend.of(x, w, b, labels, where="Dense")
    check_softmax_labels((x.shape[0], w.shape[0]), labels, check=check)
    epilog = dgrad_epilog(input_activation, bgrad=input_has_bias) if need_input_grad else None
    if epilog is not None:  # everything from one call, where the backend has that form
        whole = be.linear_xent_grads(x, w, b, labels, epilog, input_aux, grad_scale,
                                     grad_dtype, overlap=overlap_wgrad)
        if whole is not None:
            loss, y, dw, db, dx, input_db = whole
            return loss, y, _layer_grads(dw, db, b is not None, None), dx, input_db
    fused = be.linear_softmax_xent(x, w, b, labels, epilog, input_aux, grad_scale, grad_dtype)
    if fused is not None:
        loss, y, dy, dx, input_db = fused
        return loss, y, _weight_grads(be, dy, x, b is not None, None, overlap_wgrad), dx, \
            input_db
    head = be.linear_xent(x, w, b, labels, grad_scale, grad_dtype)  # forward and loss as one
    if head is not None:
        loss, y, dy = head
    else:
        y, _ = be.linear(x, w, b, forward_epilog(None, bias=b is not None, aux=True))
        loss, dy = be.softmax_cross_entropy(y, labels, grad_scale, grad_dtype)
    overlap_wgrad, late = _wgrad_order(be, overlap_wgrad, need_input_grad, dy, x)
    if epilog is not None:
        both = _both_grads(be, dy, x, w, b is not None, None, epilog, input_aux, overlap_wgrad)
        if both is not None:
            return (loss, y, *both)
    if not late:
        grads = _weight_grads(be, dy, x, b is not None, None, overlap_wgrad)
        del x
    dx = input_db = None
    if epilog is not None:
        dx, input_db = be.linear_dgrad(dy, w, epilog, input_aux)
    if late:
        grads = _weight_grads(be, dy, x, b is not None, None, overlap_wgrad)
    return loss, y, grads, dx, input_db
