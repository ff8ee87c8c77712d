"""Bad input to each layer and loss fails with an error that names the layer, what it expected,
what it received, and the fix (the project's error standard; see docs/custom-layers.md).

Inputs and sizes are drawn fresh on every run: the checks must hold for any batch and width,
and a failure shows the sizes in the message that did not match."""

import re

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import losses, nn
from fuseflow.losses import LossError
from fuseflow.nn import LayerError

rng = np.random.default_rng()


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def size(lo=2, hi=40):
    return int(rng.integers(lo, hi))


def raises(exc, *parts):
    """``pytest.raises`` whose message holds ``parts`` in this order (each taken literally)."""
    return pytest.raises(exc, match=".*".join(map(re.escape, parts)))


# ---- Dense ----------------------------------------------------------------------------------
def dense(features=None, inp=None, **kw):
    features, inp = features or size(), inp or size()
    layer = nn.Dense(features, **kw)
    _, params = layer.init(ff.random.key(int(rng.integers(1 << 30))), (inp,))
    return layer, params, features, inp


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_dense_bias_of_another_dtype(dtype):
    layer, p, f, inp = dense()
    bad = {"w": p["w"], "b": p["b"].astype(dtype)}
    x = randn(size(), inp)
    if dtype == np.int32:
        want = ("expected params['b'] of a floating dtype (float16, bfloat16, float32 or float64), "
                "got int32", "Fix: ff.tree.astype(params, np.float32)")
    else:
        want = (f"expected params['b'] of dtype float32 (the dtype of params['w']), got "
                f"{np.dtype(dtype)}", "Fix: ff.tree.astype(params, np.float32)")
    with raises(LayerError, f"Dense({f}): ", *want):
        layer.forward(bad, x)
    _, res = layer.forward(p, x)
    with raises(LayerError, f"Dense({f}): ", *want):  # backward checks the params too
        layer.backward(bad, res, randn(len(x), f))


def test_dense_weights_of_an_integer_dtype():
    layer, p, f, inp = dense()
    bad = ff.tree.astype(p, np.int64)
    with raises(LayerError, f"Dense({f}): expected params['w'] of a floating dtype", "got int64",
                "Fix: ff.tree.astype(params, np.float32)"):
        layer.forward(bad, randn(size(), inp))


@pytest.mark.parametrize("key,value", [("w", "list"), ("b", None), ("b", "list")])
def test_dense_params_that_are_not_arrays(key, value):
    layer, p, f, inp = dense(activation="relu")
    bad = dict(p)
    bad[key] = p[key].tolist() if value == "list" else value
    got = "list" if value == "list" else "NoneType"
    with raises(LayerError, f"Dense({f}, activation='relu'): params['{key}'] must be an array",
                f"got {got}", "Fix: use the params returned by this model's init"):
        layer.forward(bad, randn(size(), inp))


def test_dense_params_that_are_not_a_dict():
    layer, p, f, inp = dense()
    with raises(LayerError, f"Dense({f}): params must be a dict with keys ['b', 'w'], got tuple",
                "Fix: use the params returned by this model's init"):
        layer.forward((p["w"], p["b"]), randn(size(), inp))


@pytest.mark.parametrize("saved", ["float64", "list"])
def test_dense_saved_input_of_another_dtype_or_type(saved):
    layer, p, f, inp = dense()
    x = randn(size(), inp)
    _, res = layer.forward(p, x)
    if saved == "float64":
        bad, want = {"x": x.astype(np.float64)}, (
            "residuals hold an input of dtype float64 but params['w'] is float32",
            "Fix: run forward and backward with the same params")
    else:
        bad, want = {"x": x.tolist()}, (
            "residuals['x'] must be an array", "got list",
            "Fix: pass the residuals of the forward call that produced this output")
    with raises(LayerError, f"Dense({f}): ", *want):
        layer.backward(p, bad, randn(len(x), f))


def test_dense_residuals_without_the_input():
    layer, p, f, inp = dense()
    _, res = layer.forward(p, randn(size(), inp))
    with raises(LayerError, f"Dense({f}): residuals have no 'x' (got keys [])",
                "another layer", "Fix: pass the residuals"):
        layer.backward(p, {}, randn(size(), f))
    with raises(LayerError, "residuals have no 'x' (got NoneType)"):
        layer.backward(p, None, randn(size(), f))


def test_dense_relu_residuals_of_an_inference_forward():
    layer, p, f, inp = dense(activation="relu")
    x = randn(size(), inp)
    _, res = layer.forward(p, x, train=False)
    with raises(LayerError, f"Dense({f}, activation='relu'): residuals have no 'relu_aux' "
                "(got keys ['x'])", "inference forward (train=False)", "Fix:"):
        layer.backward(p, res, randn(len(x), f))


@pytest.mark.parametrize("features", [True, False, 0, -3, 2.0, "8", None])
def test_dense_features_must_be_a_positive_int(features):
    with raises(LayerError, f"Dense: features must be a positive int, got {features!r}",
                "Fix: an int >= 1 (not a bool), e.g. Dense(10)"):
        nn.Dense(features)


def test_dense_features_accepts_numpy_ints():
    f = size()
    assert nn.Dense(np.int64(f)).features == f


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, bool, np.complex64, "int64", "nonsense"])
def test_dense_param_dtype_must_be_a_float_dtype(dtype):
    f = size()
    shown = str(np.dtype(dtype)) if dtype != "nonsense" else "'nonsense'"
    with raises(LayerError, "Dense: param_dtype must be float16, bfloat16, float32 or float64, "
                            f"got {shown}",
                f"Fix: Dense({f}, param_dtype=np.float32)"):
        nn.Dense(f, param_dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, "float32"])
def test_dense_float_param_dtypes_build(dtype):
    layer, p, f, inp = dense(param_dtype=dtype)
    assert p["w"].dtype == p["b"].dtype == np.dtype(dtype)


@pytest.mark.parametrize("in_shape", [(4, 2), (), "784", (0,), (True,), 2.5])
def test_dense_init_needs_one_positive_width(in_shape):
    f = size()
    got = str(tuple(in_shape)) if isinstance(in_shape, tuple) else repr(in_shape)
    with raises(LayerError, f"Dense({f}): in_shape must be (features,), got {got}",
                f"Fix: flatten the input, e.g. Serial(Flatten(), Dense({f}))"):
        nn.Dense(f).init(ff.random.key(0), in_shape)


@pytest.mark.parametrize("layer", [nn.Dense(5, "relu"), nn.LayerNorm()], ids=repr)
def test_layer_init_takes_an_int_width_like_serial(layer):
    width = size()
    shape, params = layer.init(ff.random.key(3), width)
    shape_t, params_t = layer.init(ff.random.key(3), (width,))
    assert shape == shape_t
    for name in params_t:
        np.testing.assert_array_equal(params[name], params_t[name])


def test_dense_errors_inside_serial_name_the_position():
    f = size()
    model = nn.Serial(nn.Dense(f, "relu"), nn.Dense(3))
    inp = size()
    _, p = model.init(ff.random.key(0), (inp,))
    bad = ({"w": p[0]["w"], "b": p[0]["b"].astype(np.float64)}, p[1])
    with raises(LayerError, f"Serial layer 0 (Dense({f}, activation='relu')): expected "
                "params['b'] of dtype float32"):
        model.forward(bad, randn(size(), inp))


# ---- ReLU / GELU standing alone --------------------------------------------------------------
ACTIVATIONS = [nn.ReLU, nn.GELU]


def test_relu_backward_rejects_a_wider_dy_the_audit_case():
    r = nn.ReLU()
    _, res = r.forward({}, np.ones((4, 9), np.float32))
    with raises(LayerError, "ReLU(): dy has shape (4, 12) but the residuals were saved for an "
                "output of shape (4, 9)", "another batch or another layer",
                "Fix: pass the residuals of the forward call that produced this output"):
        r.backward({}, res, np.ones((4, 12), np.float32))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
def test_activation_dy_wider_than_the_input_but_within_the_mask_padding(act):
    """relu_aux is padded to 16-byte rows: a dy up to 128 features wider fits the mask's shape
    and used to be masked with padding bits (garbage on the GPU)."""
    layer, batch, width = act(), size(), size(1, 100)
    _, res = layer.forward({}, randn(batch, width))
    wider = width + size(1, 128 - width)  # still within the 16 mask bytes of 128 features
    with raises(LayerError, f"{layer!r}: dy has shape ({batch}, {wider}) but the residuals were "
                f"saved for an output of shape ({batch}, {width})", "Fix:"):
        layer.backward({}, res, randn(batch, wider))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
@pytest.mark.parametrize("dy_shape", ["batch", "narrower", "flat"])
def test_activation_dy_of_another_shape(act, dy_shape):
    layer, batch, a, b = act(), size(), size(), size()
    _, res = layer.forward({}, randn(batch, a, b))  # any (batch, ...) input
    shape = {"batch": (batch + size(1, 5), a, b), "narrower": (batch, a, b - 1),
             "flat": (batch, a * b)}[dy_shape]
    with raises(LayerError, f"{layer!r}: dy has shape {shape} but the residuals were saved for "
                f"an output of shape {(batch, a, b)}", "Fix: pass the residuals"):
        layer.backward({}, res, randn(*shape))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_activation_dy_of_another_dtype(act, dtype):
    layer, batch, width = act(), size(), size()
    _, res = layer.forward({}, randn(batch, width))
    with raises(LayerError, f"{layer!r}: expected dy of dtype float32, got {np.dtype(dtype)}",
                "Fix: dy.astype(float32)"):
        layer.backward({}, res, randn(batch, width).astype(dtype))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
def test_activation_backward_still_correct_for_matching_dy(act):
    """The checks leave the result alone: float64 (check_grads' dtype), a 3-D input."""
    layer, batch, a, b = act(), size(), size(), size()
    x = randn(batch, a, b, dtype=np.float64)
    y, res = layer.forward({}, x)
    dy = randn(*y.shape, dtype=np.float64)
    _, dx = layer.backward({}, res, dy)
    assert dx.shape == x.shape and dx.dtype == np.float64
    if act is nn.ReLU:
        np.testing.assert_array_equal(dx, np.where(x >= 0, dy, 0.0))


def test_relu_backward_ignores_garbage_in_the_mask_padding():
    from tests.reference import fill_padding_with_garbage

    layer, batch, width = nn.ReLU(), size(), size(1, 60)
    x = randn(batch, width)
    _, res = layer.forward({}, x)
    dirty = dict(res, relu_aux=fill_padding_with_garbage(res["relu_aux"], width, rng))
    dy = randn(batch, width)
    np.testing.assert_array_equal(layer.backward({}, dirty, dy)[1], layer.backward({}, res, dy)[1])


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
def test_activation_residuals_of_an_inference_forward_or_another_layer(act):
    layer, batch, width = act(), size(), size()
    x = randn(batch, width)
    aux = "relu_aux" if act is nn.ReLU else "gelu_aux"
    _, res = layer.forward({}, x, train=False)
    with raises(LayerError, f"{layer!r}: residuals have no '{aux}' or 'shape' or 'dtype' "
                "(got keys [])", "inference forward (train=False)", "Fix:"):
        layer.backward({}, res, randn(batch, width))
    _, flat_res = nn.Flatten().forward({}, x)
    with raises(LayerError, f"{layer!r}: residuals have no '{aux}' or 'dtype' (got keys "
                "['shape'])", "another layer"):
        layer.backward({}, flat_res, randn(batch, width))
    with raises(LayerError, f"{layer!r}: residuals have no", "(got NoneType)"):
        layer.backward({}, None, randn(batch, width))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
@pytest.mark.parametrize("bad", ["int32", "complex64", "bool", "list", "1-D"])
def test_activation_input_must_be_a_float_batch(act, bad):
    layer, batch, width = act(), size(), size()
    x = randn(batch, width)
    if bad == "list":
        x, want = x.tolist(), ("input must be an array (NumPy or CuPy), got list",
                               "Fix: np.asarray(x, dtype=np.float32)")
    elif bad == "1-D":
        x, want = x[0], (f"expected input of shape (batch, features), got ({width},)",
                         "Fix: keep the batch axis")
    else:
        x, want = x.astype(bad), ("expected input of a floating dtype (float16, bfloat16, "
                                  f"float32 or float64), got {bad}", "Fix: x.astype(np.float32)")
    with raises(LayerError, f"{layer!r}: ", *want):
        layer.forward({}, x)


def test_activation_dy_that_is_not_an_array():
    layer, batch, width = nn.GELU(), size(), size()
    _, res = layer.forward({}, randn(batch, width))
    with raises(LayerError, "GELU(): dy must be an array (NumPy or CuPy), got list"):
        layer.backward({}, res, randn(batch, width).tolist())


def test_standalone_activation_error_inside_serial_names_the_position():
    model = nn.Serial(nn.LayerNorm(), nn.ReLU())
    batch, width = size(), size()
    _, p = model.init(ff.random.key(0), (width,))
    _, res = model.forward(p, randn(batch, width))
    with raises(LayerError, "Serial layer 1 (ReLU()): dy has shape", f"({batch}, {width})"):
        model.backward(p, res, randn(batch, width + 1))


# ---- LayerNorm -------------------------------------------------------------------------------
def layernorm(width=None, **kw):
    width = width or size()
    layer = nn.LayerNorm(**kw)
    _, params = layer.init(ff.random.key(0), (width,))
    params = ff.tree.map(lambda p: p + randn(*p.shape, dtype=p.dtype), params)
    return layer, params, width


@pytest.mark.parametrize("keys", [("gamma", "beta"), ("scale",), ("scale", "bias", "extra")])
def test_layernorm_params_with_wrong_keys(keys):
    layer, p, width = layernorm()
    bad = {k: p.get(k, p["scale"]) for k in keys}
    with raises(LayerError, "LayerNorm(): params must be a dict with keys ['bias', 'scale'], got "
                f"{sorted(keys)}", "Fix: use the params returned by this model's init"):
        layer.forward(bad, randn(size(), width))


def test_layernorm_params_without_scale_need_only_bias():
    layer, p, width = layernorm(use_scale=False)
    assert repr(layer) == "LayerNorm(use_scale=False)" and set(p) == {"bias"}
    with raises(LayerError, "LayerNorm(use_scale=False): params must be a dict with keys "
                "['bias'], got ['bias', 'scale']"):
        layer.forward(dict(p, scale=p["bias"]), randn(size(), width))


def test_layernorm_params_of_mismatched_shapes_or_dtypes():
    layer, p, width = layernorm()
    x = randn(size(), width)
    with raises(LayerError, f"LayerNorm(): params['bias'] must have shape ({width},), got "
                f"({width + 1},)", "params from another model"):
        layer.forward(dict(p, bias=randn(width + 1)), x)
    with raises(LayerError, "LayerNorm(): expected params['bias'] of dtype float32 (the dtype of "
                "params['scale']), got float64", "Fix: ff.tree.astype(params"):
        layer.forward(dict(p, bias=p["bias"].astype(np.float64)), x)
    with raises(LayerError, "LayerNorm(): expected params['scale'] of a floating dtype",
                "got int32"):
        layer.forward(ff.tree.astype(p, np.int32), x)
    with raises(LayerError, "LayerNorm(): params['scale'] must be an array", "got list"):
        layer.forward(dict(p, scale=p["scale"].tolist()), x)


@pytest.mark.parametrize("in_shape", [(4, 2), (), (0,), "7"])
def test_layernorm_init_needs_one_positive_width(in_shape):
    got = str(tuple(in_shape)) if isinstance(in_shape, tuple) else repr(in_shape)
    with raises(LayerError, f"LayerNorm(): in_shape must be (features,), got {got}",
                "Fix: flatten the input, e.g. Serial(Flatten(), LayerNorm())"):
        nn.LayerNorm().init(ff.random.key(0), in_shape)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.complex64, np.complex128,
                                   bool])
def test_layernorm_input_of_a_non_float_dtype(dtype):
    layer, p, width = layernorm()
    x = (randn(size(), width) * 5).astype(dtype)
    with raises(LayerError, "LayerNorm(): expected input of a floating dtype (float16, "
                            f"bfloat16, float32 or float64), got {np.dtype(dtype)}",
                "Fix: x.astype(np.float32)"):
        layer.forward(p, x)


def test_layernorm_float64_input_against_float32_params():
    layer, p, width = layernorm()
    with raises(LayerError, "LayerNorm(): expected input of dtype float32, got float64",
                "Fix: x.astype(float32), or cast the params with ff.tree.astype"):
        layer.forward(p, randn(size(), width, dtype=np.float64))
    with raises(LayerError, "LayerNorm(): expected input of dtype float64, got float32"):
        layer.forward(ff.tree.astype(p, np.float64), randn(size(), width))


def test_layernorm_dtypes_that_still_run():
    """float16 input on float32 params (computed in float32), one dtype throughout, and no
    params at all (any float input)."""
    layer, p, width = layernorm()
    batch = size()
    for x, params in [(randn(batch, width, dtype=np.float16), p),
                      (randn(batch, width, dtype=np.float64), ff.tree.astype(p, np.float64)),
                      (randn(batch, width, dtype=np.float16), ff.tree.astype(p, np.float16))]:
        y, res = layer.forward(params, x)
        assert y.dtype == x.dtype and y.shape == x.shape
        grads, dx = layer.backward(params, res, randn(batch, width, dtype=x.dtype))
        assert dx.dtype == x.dtype and grads["scale"].dtype == params["scale"].dtype
    bare = nn.LayerNorm(use_scale=False, use_bias=False)
    x = randn(batch, width, dtype=np.float64)
    y, res = bare.forward({}, x)
    np.testing.assert_allclose(y.mean(1), 0, atol=1e-12)
    assert bare.backward({}, res, x)[1].dtype == np.float64


def test_layernorm_backward_with_residuals_of_another_layer_or_batch():
    layer, p, width = layernorm()
    batch = size()
    x = randn(batch, width)
    _, res = layer.forward(p, x)
    with raises(LayerError, "LayerNorm(): residuals have no 'xhat' or 'rstd' (got keys [])",
                "another layer", "Fix: pass the residuals"):
        layer.backward(p, {}, randn(batch, width))
    _, dense_res = nn.Dense(width).forward(nn.Dense(width).init(ff.random.key(0), (3,))[1],
                                           randn(batch, 3))
    with raises(LayerError, "LayerNorm(): residuals have no 'xhat' or 'rstd' (got keys ['x'])"):
        layer.backward(p, dense_res, randn(batch, width))
    with raises(LayerError, f"LayerNorm(): dy has shape ({batch + 1}, {width}) but the residuals "
                f"were saved for an output of shape ({batch}, {width})", "Fix:"):
        layer.backward(p, res, randn(batch + 1, width))
    _, other, _ = layernorm(width + 1)
    _, res_other = layer.forward(other, randn(batch, width + 1))
    with raises(LayerError, f"LayerNorm(): residuals hold a normalized input of shape ({batch}, "
                f"{width + 1})", f"this layer takes (batch, {width})", "another layer"):
        layer.backward(p, res_other, randn(batch, width + 1))


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_layernorm_dy_of_another_dtype(dtype):
    layer, p, width = layernorm()
    batch = size()
    _, res = layer.forward(p, randn(batch, width))
    with raises(LayerError, f"LayerNorm(): expected dy of dtype float32, got {np.dtype(dtype)}",
                "Fix: dy.astype(float32)"):
        layer.backward(p, res, randn(batch, width).astype(dtype))


@pytest.mark.parametrize("eps", [-1e-5, 0.0, -1, float("nan"), float("inf"), "1e-5", True, None])
def test_layernorm_eps_must_be_positive(eps):
    with raises(LayerError, "LayerNorm: eps must be a positive number", f"got {eps!r}",
                "Fix: LayerNorm(eps=1e-5)"):
        nn.LayerNorm(eps=eps)


def test_layernorm_hyperparameters_show_in_errors():
    layer, p, width = layernorm(eps=1e-3, param_dtype=np.float64)
    assert repr(layer) == "LayerNorm(eps=0.001, param_dtype=float64)"
    with raises(LayerError, "LayerNorm(eps=0.001, param_dtype=float64): expected input of dtype "
                "float64, got float32"):
        layer.forward(p, randn(size(), width))
    with raises(LayerError, "LayerNorm: param_dtype must be float16, bfloat16, float32 or "
                            "float64, got int8",
                "Fix: LayerNorm(param_dtype=np.float32)"):
        nn.LayerNorm(param_dtype=np.int8)


def test_layernorm_error_inside_serial_names_the_position():
    width = size()
    model = nn.Serial(nn.Dense(width), nn.LayerNorm(), nn.Dense(3))
    inp = size()
    _, p = model.init(ff.random.key(0), (inp,))
    bad = (p[0], {"gamma": p[1]["scale"], "beta": p[1]["bias"]}, p[2])
    with raises(LayerError, "Serial layer 1 (LayerNorm()): params must be a dict with keys"):
        model.forward(bad, randn(size(), inp))


# ---- Dropout ---------------------------------------------------------------------------------
def dropped(rate=None, shape=None):
    layer = nn.Dropout(rate if rate is not None else float(rng.uniform(0.05, 0.9)))
    x = randn(*(shape or (size(), size())))
    y, res = layer.forward({}, x, key=ff.random.key(int(rng.integers(1 << 30))))
    return layer, x, y, res


@pytest.mark.parametrize("rate", ["a", "0.5", None, True, 1.0, 1, -0.1, 1.5, float("nan"),
                                  float("inf")])
def test_dropout_rate_must_be_a_number_in_0_1(rate):
    with raises(LayerError, "Dropout: rate must be a number in [0, 1) (the fraction of inputs "
                f"zeroed in training), got {rate!r}", "Fix: Dropout(0.1)"):
        nn.Dropout(rate)


@pytest.mark.parametrize("rate", [0, 0.0, 0.25, np.float32(0.5), np.float64(0.999)])
def test_dropout_rates_that_build(rate):
    assert nn.Dropout(rate).rate == float(rate)


def test_dropout_backward_with_residuals_of_another_layer():
    layer, x, y, res = dropped()
    _, ln_res = nn.LayerNorm(use_scale=False, use_bias=False).forward({}, x)
    with raises(LayerError, f"{layer!r}: residuals have no 'scale' (got keys ['rstd', 'xhat'])",
                "another layer", "Fix: pass the residuals"):
        layer.backward({}, ln_res, randn(*x.shape))
    with raises(LayerError, f"{layer!r}: residuals have no 'scale' (got tuple)"):
        layer.backward({}, (res,), randn(*x.shape))


def test_dropout_backward_with_dy_of_another_shape_or_dtype():
    layer, x, y, res = dropped()
    batch, width = x.shape
    with raises(LayerError, f"{layer!r}: dy has shape ({batch}, {width + 1}) but the residuals "
                f"were saved for an output of shape ({batch}, {width})", "Fix: pass the residuals"):
        layer.backward({}, res, randn(batch, width + 1))
    with raises(LayerError, f"{layer!r}: expected dy of dtype float32, got float64",
                "Fix: dy.astype(float32)"):
        layer.backward({}, res, randn(batch, width, dtype=np.float64))
    with raises(LayerError, f"{layer!r}: dy must be an array (NumPy or CuPy), got list"):
        layer.backward({}, res, randn(batch, width).tolist())


def test_dropout_backward_of_an_inference_forward_is_the_identity():
    layer = nn.Dropout(0.5)
    x = randn(size(), size())
    y, res = layer.forward({}, x, train=False)
    assert res == {} and y is x
    dy = randn(*x.shape)
    assert layer.backward({}, res, dy)[1] is dy


@pytest.mark.parametrize("bad", ["int64", "complex64", "list"])
def test_dropout_input_must_be_a_float_array(bad):
    """An integer input would be scaled by 1/(1-rate) in its own dtype: truncated."""
    x = randn(size(), size())
    x = x.tolist() if bad == "list" else (x * 4).astype(bad)
    want = "must be an array (NumPy or CuPy), got list" if bad == "list" else \
        f"expected input of a floating dtype (float16, bfloat16, float32 or float64), got {bad}"
    with raises(LayerError, "Dropout(0.3): ", want, "Fix:"):
        nn.Dropout(0.3).forward({}, x, key=ff.random.key(0))


# ---- Flatten ---------------------------------------------------------------------------------
def test_flatten_backward_with_dy_of_another_shape():
    batch, a, b = size(), size(), size()
    layer = nn.Flatten()
    y, res = layer.forward({}, randn(batch, a, b))
    assert y.shape == (batch, a * b)
    for shape in [(batch, a * b + 1), (batch + 1, a * b), (batch, a, b)]:
        with raises(LayerError, f"Flatten(): dy has shape {shape} but the residuals were saved "
                    f"for an output of shape ({batch}, {a * b})", "another batch or another layer",
                    "Fix: pass the residuals of the forward call that produced this output"):
            layer.backward({}, res, randn(*shape))
    assert layer.backward({}, res, randn(batch, a * b))[1].shape == (batch, a, b)


def test_flatten_backward_with_residuals_of_another_layer():
    layer, x, y, res = dropped(shape=(size(), size()))
    with raises(LayerError, "Flatten(): residuals have no 'shape' (got keys [])", "another layer",
                "Fix: pass the residuals"):
        nn.Flatten().backward({}, {}, randn(*x.shape))
    with raises(LayerError, "Flatten(): residuals have no 'shape' (got keys ['scale'])"):
        nn.Flatten().backward({}, res, randn(*x.shape))


@pytest.mark.parametrize("bad", ["list", "0-d"])
def test_flatten_input_must_be_an_array_with_a_batch_axis(bad):
    x = randn(size(), size(), size())
    if bad == "list":
        x, want = x.tolist(), ("input must be an array (NumPy or CuPy), got list",
                               "Fix: np.asarray(x, dtype=np.float32)")
    else:
        x, want = x[0, 0, 0], ("expected input of shape (batch, d1, d2, ...), got a 0-d array",
                               "Fix: pass a batch")
    with raises(LayerError, "Flatten(): ", *want):
        nn.Flatten().forward({}, x)


def test_flatten_error_inside_serial_names_the_position():
    batch, a, b = size(), size(), size()
    model = nn.Serial(nn.Flatten(), nn.Dense(size()))
    _, p = model.init(ff.random.key(0), (a, b))
    _, res = model.forward(p, randn(batch, a, b))
    with raises(LayerError, "Serial layer 0 (Flatten()): residuals have no 'shape'"):
        model.backward(p, ({}, res[1]), randn(batch, model.layers[1].features))


# ---- losses ----------------------------------------------------------------------------------
def logits_and_labels(batch=None, classes=None):
    batch, classes = batch or size(), classes or size()
    return randn(batch, classes), rng.integers(0, classes, batch), batch, classes


def test_accuracy_with_labels_of_the_wrong_length():
    logits, labels, batch, classes = logits_and_labels()
    short = labels[: int(rng.integers(0, batch - 1))]
    with raises(LossError, f"accuracy: got {batch} outputs but {len(short)} labels",
                "Fix: pass the labels of the same batch"):
        losses.accuracy(logits, short)


@pytest.mark.parametrize("fn", [losses.accuracy, losses.softmax_cross_entropy],
                         ids=lambda f: f.__name__)
def test_one_hot_labels(fn):
    logits, labels, batch, classes = logits_and_labels()
    one_hot = np.eye(classes)[labels]
    with raises(LossError, f"{fn.__name__}: labels must be a 1-D integer array of class indices, "
                f"got shape ({batch}, {classes}) dtype float64", "labels.argmax(1)"):
        fn(logits, one_hot)


@pytest.mark.parametrize("fn", [losses.accuracy, losses.softmax_cross_entropy],
                         ids=lambda f: f.__name__)
def test_one_label_instead_of_a_batch(fn):
    logits, labels, batch, classes = logits_and_labels()
    with raises(LossError, f"{fn.__name__}: labels must hold one class index per sample, shape "
                f"({batch},), got a 0-d array", "Fix: pass the labels of the batch, y[i:j]"):
        fn(logits, labels[0])


@pytest.mark.parametrize("fn", [losses.accuracy, losses.softmax_cross_entropy],
                         ids=lambda f: f.__name__)
def test_labels_that_are_not_an_array(fn):
    logits, labels, batch, classes = logits_and_labels()
    with raises(LossError, f"{fn.__name__}: labels must be an array, got list",
                "Fix: np.asarray(labels)"):
        fn(logits, labels.tolist())


@pytest.mark.parametrize("fn", [losses.accuracy, losses.softmax_cross_entropy, losses.mse,
                                losses.sigmoid_binary_cross_entropy], ids=lambda f: f.__name__)
def test_empty_batch(fn):
    classes = size()
    logits = randn(0, classes)
    targets = np.zeros(0, np.int64) if fn in (losses.accuracy, losses.softmax_cross_entropy) \
        else randn(0, classes)
    with raises(LossError, f"{fn.__name__}: got an empty batch (outputs of shape (0, {classes}))",
                "NaN", "Fix: skip empty batches"):
        fn(logits, targets)


def test_accuracy_still_counts():
    logits, labels, batch, classes = logits_and_labels()
    want = (logits.argmax(1) == labels).mean()
    assert float(losses.accuracy(logits, labels)) == want
    assert float(losses.accuracy(logits, labels.astype(np.uint8))) == want


@pytest.mark.parametrize("where", ["above", "below", "nan"])
def test_binary_cross_entropy_targets_outside_0_1(where):
    logits = randn(size(), size(1, 4))
    targets = rng.uniform(0, 1, logits.shape).astype(np.float32)
    i = tuple(int(rng.integers(n)) for n in logits.shape)
    targets[i] = {"above": rng.uniform(1.01, 5), "below": -rng.uniform(0.01, 5),
                  "nan": np.nan}[where]
    with raises(LossError, "sigmoid_binary_cross_entropy: targets must lie in [0, 1]",
                "got values in [", "Fix: binary labels as 0/1"):
        losses.sigmoid_binary_cross_entropy(logits, targets)
    # check=False skips the range check (as softmax_cross_entropy's check=False does)
    loss, grad = losses.sigmoid_binary_cross_entropy(logits, targets, check=False)
    assert grad.shape == logits.shape


def test_binary_cross_entropy_targets_of_a_complex_dtype():
    logits = randn(size(), 1)
    with raises(LossError, "sigmoid_binary_cross_entropy: targets must be real numbers in [0, 1], "
                "got dtype complex64", "Fix: targets.astype(np.float32)"):
        losses.sigmoid_binary_cross_entropy(logits, np.ones(logits.shape, np.complex64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, bool])
def test_binary_cross_entropy_valid_targets_still_run(dtype):
    logits = randn(size(), size(1, 4))
    targets = (rng.uniform(0, 1, logits.shape) > 0.5).astype(dtype)
    loss, grad = losses.sigmoid_binary_cross_entropy(logits, targets)
    assert float(loss) >= 0 and grad.shape == logits.shape and grad.dtype == logits.dtype
