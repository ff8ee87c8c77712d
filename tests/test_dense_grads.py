"""The dense op's route through a backend's fused form of both gradients (``linear_grads``).

No CPU backend has one, so the NumPy backend is told it has: its fused form computes the two
gradients with its own weight- and input-gradient code, and every way ``dense_backward`` and
``dense_softmax_xent`` can call it (bias or none, the bias gradient from the layer above or
from the call, an output layer with its loss) must give what the two separate calls give,
with the epilogs the separate calls would use.
"""

import numpy as np
import pytest

from fuseflow.backend import get
from fuseflow.ops.dense import dense_backward, dense_softmax_xent


@pytest.fixture
def fused(monkeypatch):
    """The NumPy backend with a fused form; returns the list of (wgrad, dgrad) epilogs and
    overlap flags it was called with."""
    be = get("numpy")
    seen = []

    def linear_grads(dy, x, w, wspec, dspec, aux, overlap):
        seen.append((wspec.name, dspec.name, overlap))
        dw, db = be._linear_wgrad(dy, x, wspec)
        dx, dbx = be._linear_dgrad(dy, w, dspec, aux)
        return dw, db, dx, dbx

    monkeypatch.setattr(be, "fuses_grads", True, raising=False)
    monkeypatch.setattr(be, "_linear_grads", linear_grads)
    return seen


def _layer(rng, bias):
    params = {"w": rng.standard_normal((10, 24))}
    if bias:
        params["b"] = rng.standard_normal(10)
    x = rng.standard_normal((16, 24))
    _, aux = get("numpy").activation(rng.standard_normal((16, 24)), "relu")
    return params, x, aux


def _equal(a, b):
    np.testing.assert_equal(a, b)  # nested dicts, tuples and arrays, exactly


@pytest.mark.parametrize("case", ["bias", "no bias", "bias from above", "no input bias"])
def test_dense_backward_through_the_fused_form_equals_the_two_calls(case, fused, monkeypatch):
    rng = np.random.default_rng(3)
    params, x, aux = _layer(rng, bias=case != "no bias")
    dy = rng.standard_normal((16, 10))
    kwargs = dict(input_activation="relu", input_aux=aux, input_has_bias=case != "no input bias")
    if case == "bias from above":
        kwargs["pre_grad"] = (dy, rng.standard_normal(10))
    else:
        kwargs["dy"] = dy
    got = dense_backward(params, {"x": x}, **kwargs)
    wgrad = "BGRADB" if case in ("bias", "no input bias") else "DEFAULT"
    dgrad = "DRELU" if case == "no input bias" else "DRELU_BGRAD"
    assert fused == [(wgrad, dgrad, False)]
    monkeypatch.setattr(get("numpy"), "fuses_grads", False)
    want = dense_backward(params, {"x": x}, **kwargs)
    _equal(got, want)
    if case == "bias from above":  # the layer above's bias gradient is passed on as is
        assert got[0]["b"] is kwargs["pre_grad"][1]


def test_dense_softmax_xent_through_the_fused_form_equals_the_two_calls(fused, monkeypatch):
    rng = np.random.default_rng(4)
    params, x, aux = _layer(rng, bias=True)
    labels = rng.integers(0, 10, 16)
    kwargs = dict(input_activation="relu", input_aux=aux, input_has_bias=True,
                  release_input=True)
    got = dense_softmax_xent(params, {"x": x}, labels, **kwargs)
    assert fused == [("BGRADB", "DRELU_BGRAD", False)]
    monkeypatch.setattr(get("numpy"), "fuses_grads", False)
    _equal(got, dense_softmax_xent(params, {"x": x}, labels, **kwargs))


def test_no_fused_form_without_an_input_gradient(fused):
    """The lowest layer (no input gradient) runs only its weight gradient."""
    rng = np.random.default_rng(5)
    params, x, _ = _layer(rng, bias=True)
    grads, dx, _ = dense_backward(params, {"x": x}, rng.standard_normal((16, 10)),
                                  need_input_grad=False)
    assert fused == [] and dx is None and set(grads) == {"w", "b"}


# ---- the output layer's forward and loss as one call (``linear_xent``) -------------------------
@pytest.mark.parametrize("scaled", [False, True])
def test_dense_softmax_xent_through_a_fused_forward_and_loss_equals_the_two_calls(
        scaled, monkeypatch):
    """A backend's fused forward-and-loss (``linear_xent``, here the NumPy backend's own
    ``linear`` then ``softmax_cross_entropy``, told it has one) is asked with the layer's
    operands, the labels and the loss scale, and ``dense_softmax_xent`` gives what the two
    calls give, the gradients after it included (the one-pass gradients too)."""
    be = get("numpy")
    seen = []

    def linear_xent(x, w, bias, labels, grad_scale, grad_dtype):
        seen.append((x.shape, w.shape, bias is not None, labels.shape, grad_scale, grad_dtype))
        y, _ = be.linear(x, w, bias, "BIAS" if bias is not None else "DEFAULT")
        loss, dy = be.softmax_cross_entropy(y, labels, grad_scale, grad_dtype)
        return loss, y, dy

    rng = np.random.default_rng(5)
    params, x, aux = _layer(rng, bias=True)
    labels = rng.integers(0, 10, 16)
    scale = np.float32(8.0) if scaled else None
    kwargs = dict(input_activation="relu", input_aux=aux, input_has_bias=True,
                  grad_scale=scale, grad_dtype=None)
    want = dense_softmax_xent(params, {"x": x}, labels, **kwargs)
    monkeypatch.setattr(be, "fuses_xent", True, raising=False)
    monkeypatch.setattr(be, "_linear_xent", linear_xent)
    got = dense_softmax_xent(params, {"x": x}, labels, **kwargs)
    assert seen == [((16, 24), (10, 24), True, (16,), scale, kwargs["grad_dtype"])]
    _equal(got, want)
    seen.clear()
    monkeypatch.setattr(be, "_linear_xent", lambda *a: None)  # no form for these operands
    _equal(dense_softmax_xent(params, {"x": x}, labels, **kwargs), want)
