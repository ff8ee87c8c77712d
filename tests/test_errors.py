"""Bad input gets an error that names the layer, what was expected, what came, and the fix.
One test per case."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow.losses import LossError
from fuseflow.nn import LayerError


@pytest.fixture
def mlp():
    model = nn.Serial(nn.Dense(16, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (784,))
    return model, params


def x_of(batch=4, width=784, dtype=np.float32):
    return np.random.default_rng(0).standard_normal((batch, width)).astype(dtype)


def test_wrong_input_width(mlp):
    model, params = mlp
    with pytest.raises(LayerError, match=r"Serial layer 0 \(Dense\(16, activation='relu'\)\).*"
                                         r"expected input of shape \(batch, 784\), got \(4, 100\)"):
        model.forward(params, x_of(width=100))


def test_images_not_flattened(mlp):
    model, params = mlp
    with pytest.raises(LayerError, match=r"got \(4, 28, 28\).*Fix: flatten"):
        model.forward(params, x_of().reshape(4, 28, 28))


def test_wrong_dtype(mlp):
    model, params = mlp
    with pytest.raises(LayerError, match=r"expected input of dtype float32, got float64.*Fix"):
        model.forward(params, x_of(dtype=np.float64))


def test_uint8_images(mlp):
    model, params = mlp
    with pytest.raises(LayerError, match=r"dtype float32, got uint8"):
        model.forward(params, (x_of() > 0).astype(np.uint8))


def test_params_of_another_model(mlp):
    model, _ = mlp
    _, other = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10)).init(ff.random.key(0), (784,))
    with pytest.raises(LayerError, match=r"Dense\(16.*params\['w'\] must have shape \(16, in\), "
                                         r"got \(32, 784\).*another model"):
        model.forward(other, x_of())


def test_params_with_wrong_number_of_layers(mlp):
    model, params = mlp
    with pytest.raises(LayerError, match=r"one entry per layer \(2\), got 3 entries"):
        model.forward(params + ({},), x_of())


def test_params_with_wrong_keys(mlp):
    model, params = mlp
    bad = ({"weight": params[0]["w"], "b": params[0]["b"]}, params[1])
    with pytest.raises(LayerError, match=r"keys \['b', 'w'\], got \['b', 'weight'\]"):
        model.forward(bad, x_of())


def test_residuals_from_another_batch(mlp):
    model, params = mlp
    _, res = model.forward(params, x_of(batch=4))
    dy = np.ones((8, 10), np.float32)
    with pytest.raises(LayerError, match=r"Dense\(10\).*dy has batch 8 but the residuals were "
                                         r"saved for batch 4.*another batch"):
        model.backward(params, res, dy)


def test_residuals_from_another_layer(mlp):
    model, params = mlp
    _, res = model.forward(params, x_of())
    swapped = (res[1], res[0])
    with pytest.raises(LayerError, match=r"Serial layer 1 \(Dense\(10\)\): residuals hold an "
                                         r"input of shape \(4, 784\) but this layer takes "
                                         r"\(batch, 16\): residuals from another layer"):
        model.backward(params, swapped, np.ones((4, 10), np.float32))


def test_residuals_from_inference_forward(mlp):
    model, params = mlp
    _, res = model.forward(params, x_of(), train=False)
    with pytest.raises(LayerError, match=r"Serial layer 1 \(Dense\(10\)\): the layer below "
                                         r"has no relu_aux.*train=False"):
        model.backward(params, res, np.ones((4, 10), np.float32))


def test_standalone_relu_residuals_from_another_batch():
    layer = nn.ReLU()
    _, res = layer.forward({}, x_of(batch=4, width=9))
    with pytest.raises(LayerError, match=r"ReLU\(\).*another batch or another layer"):
        layer.backward({}, res, x_of(batch=2, width=9))


def test_labels_of_wrong_length():
    with pytest.raises(LossError, match=r"got 4 outputs but 3 labels.*same batch"):
        ff.losses.softmax_cross_entropy(x_of(width=10), np.array([0, 1, 2]))


def test_labels_out_of_range():
    with pytest.raises(LossError, match=r"labels must lie in \[0, 10\).*got values in \[0, 10\]"):
        ff.losses.softmax_cross_entropy(x_of(width=10), np.array([0, 1, 2, 10]))


def test_float_labels():
    with pytest.raises(LossError, match=r"1-D integer array.*float32.*astype"):
        ff.losses.softmax_cross_entropy(x_of(width=10), np.zeros(4, np.float32))


def test_dropout_without_key():
    with pytest.raises(LayerError, match=r"Dropout\(0.5\): training needs a random key"):
        nn.Dropout(0.5).forward({}, x_of())


def test_unknown_activation():
    with pytest.raises(ValueError, match=r"activation must be one of.*'tanh'"):
        nn.Dense(10, activation="tanh")


def test_not_a_layer():
    with pytest.raises(TypeError, match=r"layer 1 .* is not a layer"):
        nn.Serial(nn.Dense(3), lambda x: x)


def test_bad_key():
    with pytest.raises(TypeError, match=r"expected a key"):
        ff.random.split(np.array([1, 2, 3]))


def test_bad_environment_settings_warn_and_fall_back(monkeypatch):
    """A mistyped FUSEFLOW_* setting warns and keeps the default instead of breaking the
    backend's import; "4e9" is a number."""
    from fuseflow.backend._env import AUTOTUNE_MODES, env_choice, env_int

    monkeypatch.setenv("FUSEFLOW_X", "4e9")
    assert env_int("FUSEFLOW_X", 7) == 4_000_000_000
    monkeypatch.setenv("FUSEFLOW_X", "lots")
    with pytest.warns(UserWarning, match="FUSEFLOW_X='lots' is not a number"):
        assert env_int("FUSEFLOW_X", 7) == 7
    monkeypatch.setenv("FUSEFLOW_AUTOTUNE", "yes")
    with pytest.warns(UserWarning, match="FUSEFLOW_AUTOTUNE='yes' is not one of"):
        assert env_choice("FUSEFLOW_AUTOTUNE", AUTOTUNE_MODES, "auto") == "auto"
    monkeypatch.setenv("FUSEFLOW_AUTOTUNE", "0")
    assert env_choice("FUSEFLOW_AUTOTUNE", AUTOTUNE_MODES, "auto") is False


def test_a_mistyped_list_setting_warns_and_keeps_the_default(monkeypatch):
    """FUSEFLOW_SKINNY_OPS=fwd used to turn every skinny kernel off without a word."""
    from fuseflow.backend._env import env_subset

    ops = ("forward", "wgrad", "dgrad")
    monkeypatch.setenv("FUSEFLOW_SKINNY_OPS", "fwd")
    with pytest.warns(UserWarning, match=r"FUSEFLOW_SKINNY_OPS='fwd': \['fwd'\] not among"):
        assert env_subset("FUSEFLOW_SKINNY_OPS", ops, "forward,wgrad") == {"forward", "wgrad"}
    monkeypatch.setenv("FUSEFLOW_SKINNY_OPS", " dgrad, forward")
    assert env_subset("FUSEFLOW_SKINNY_OPS", ops, "wgrad") == {"dgrad", "forward"}
    monkeypatch.setenv("FUSEFLOW_SKINNY_OPS", "")
    assert env_subset("FUSEFLOW_SKINNY_OPS", ops, "wgrad") == set()


@pytest.mark.parametrize("grad_fn", [ff.value_and_grad, ff.mixed_precision.value_and_grad])
def test_a_loss_must_return_its_gradient_too(grad_fn):
    """The loss contract: loss_fn(outputs, targets) -> (loss, d_loss/d_outputs)."""
    rng = np.random.default_rng(7)
    model = nn.Serial(nn.Dense(6, "relu"), nn.Dense(3))
    _, params = model.init(ff.random.key(7), (4,))
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)

    def value_only(outputs, targets):
        return ((outputs - targets) ** 2).mean()

    def wrong_grad(outputs, targets):
        return ((outputs - targets) ** 2).mean(), (outputs - targets).sum(0)

    with pytest.raises(TypeError, match=r"the loss value_only must return \(loss, "
                                        r"d_loss/d_outputs\), got float32"):
        grad_fn(model, value_only)(params, x, y)
    with pytest.raises(ValueError, match=r"the loss wrong_grad returned a gradient of shape "
                                         r"\(3,\) for outputs of shape \(5, 3\)"):
        grad_fn(model, wrong_grad)(params, x, y)
