"""The same models on the GPU and on the NumPy reference: every layer forward and backward,
a 50-step training run, mixed precision, and the errors of mixing devices. Marked ``gpu``;
skipped without CuPy, nvmath-python and a GPU."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

pytestmark = pytest.mark.gpu


LAYERS = [nn.Dense(37, "relu"), nn.Dense(13, "gelu"), nn.Dense(9), nn.Dense(1, "relu"),
          nn.ReLU(), nn.GELU(), nn.LayerNorm(), nn.Dropout(0.25),
          nn.Serial(nn.Dense(29, "relu"), nn.Dense(17), nn.GELU(), nn.Dense(5)),
          nn.Serial(nn.Dense(64), nn.ReLU(), nn.Dense(64, "relu"), nn.Dense(1))]


def host(cp, tree):
    return ff.tree.map(cp.asnumpy, tree)


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float16, 1e-2)])
@pytest.mark.parametrize("layer", LAYERS, ids=repr)
@pytest.mark.parametrize("batch", [1, 33])
def test_layer_matches_numpy_reference(cp, layer, batch, dtype, rtol):
    if dtype == np.float16 and isinstance(layer, nn.LayerNorm):
        pytest.skip("LayerNorm params are float32 by design")
    _, params = layer.init(ff.random.key(batch), (23,))
    params = ff.tree.map(lambda p: (p + 0.1 * np.random.default_rng(p.size).standard_normal(
        p.shape)).astype(dtype), params)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 23)).astype(dtype)
    x[0, :] = 0.0  # exact-zero pre-activations where biases are zero
    key = ff.random.key(7)
    y_ref, res_ref = layer.forward(params, x, key=key)
    y, res = layer.forward(ff.device_put(params, "cuda"), cp.asarray(x), key=key)
    scale = max(1.0, float(np.abs(y_ref.astype(np.float64)).max()))
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), y_ref.astype(np.float64),
                               rtol=rtol, atol=rtol * scale)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    g_ref, dx_ref = layer.backward(params, res_ref, dy)
    g, dx = layer.backward(ff.device_put(params, "cuda"), res, cp.asarray(dy))
    for a, b in zip(ff.tree.leaves(host(cp, (g, dx))), ff.tree.leaves((g_ref, dx_ref))):
        s = max(1.0, float(np.abs(b.astype(np.float64)).max()))
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                   rtol=rtol, atol=rtol * s * (10 if dtype == np.float16 else 1))


def test_relu_aux_bytes_identical_to_reference(cp):
    from fuseflow.backend.epilogs import relu_aux_rows

    for features in (1, 7, 8, 9, 31, 37, 1000):
        layer = nn.Dense(features, "relu")
        _, params = layer.init(ff.random.key(features), (19,))
        x = np.random.default_rng(features).standard_normal((45, 19)).astype(np.float32)
        x[:3] = 0.0  # zero rows + zero bias: pre-activation exactly 0, bit must be set
        _, res_ref = layer.forward(params, x)
        _, res = layer.forward(ff.device_put(params, "cuda"), cp.asarray(x))
        aux, aux_ref = cp.asnumpy(res["relu_aux"]), res_ref["relu_aux"]
        assert aux.shape == aux_ref.shape == (relu_aux_rows(features), 45)
        full, rem = divmod(features, 8)
        np.testing.assert_array_equal(aux[:full], aux_ref[:full])
        if rem:
            keep = (1 << rem) - 1
            np.testing.assert_array_equal(aux[full] & keep, aux_ref[full] & keep)
        assert (aux_ref[:, :3][: -(-features // 8)] != 0).any()


def test_inference_uses_relu_bias_and_writes_no_mask(cp):
    model = nn.Serial(nn.Dense(64, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (32,))
    params = ff.device_put(params, "cuda")
    be = ff.backend.get("cuda")
    be.reset_stats()
    y, res = model.forward(params, cp.ones((4, 32), cp.float32), train=False)
    assert "relu_aux" not in res[0] and be.calls["linear/RELU_BIAS"] == 1


def test_784_1024_1024_10_trains_identically_on_both_backends(cp):
    """Same initial params and batches: the same 50 losses to 1e-4 on CPU and GPU.

    With SGD + momentum. (Adam divides by sqrt(v): for weights whose gradient is rounding
    noise it takes full-size steps in the noise's direction, so its CPU/GPU losses were
    measured to drift to 5e-3 after ~20 steps although both backends are correct.)"""
    model = nn.Serial(nn.Dense(1024, "relu"), nn.Dense(1024, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (784,))
    opt = ff.optim.sgd(0.05, momentum=0.9)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    rng = np.random.default_rng(0)
    xs = rng.random((50, 64, 784), dtype=np.float32)
    ys = rng.integers(0, 10, (50, 64))

    def train(params, to):
        state = opt.init(params)
        losses = []
        for x, y in zip(xs, ys):
            loss, grads = grad_fn(params, to(x), to(y))
            params, state = ff.optim.update_and_apply(opt, grads, state, params)
            losses.append(float(loss))
        return losses

    cpu = train(params, lambda a: a)
    gpu = train(ff.device_put(params, "cuda"), cp.asarray)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4)
    assert cpu[-1] < cpu[0]


def test_mixed_precision_float16_training_on_gpu(cp):
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (64,))
    params = ff.device_put(params, "cuda")
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(3e-3))
    state = opt.init(params)
    grad_fn = ff.mixed_precision.value_and_grad(model, ff.losses.softmax_cross_entropy)
    x = cp.asarray(np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32))
    y = cp.arange(128) % 10
    losses = []
    for _ in range(100):
        loss, grads = grad_fn(params, x, y, loss_scale=state.scale)
        params, state = ff.optim.update_and_apply(opt, grads, state, params)
        losses.append(float(loss))
    assert all(p.dtype == cp.float32 for p in ff.tree.leaves(params))
    assert losses[-1] < 0.1 < 2.0 < losses[0]


def test_host_array_into_gpu_model_is_a_clear_error(cp):
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(2))
    _, params = model.init(ff.random.key(0), (4,))
    gpu_params = ff.device_put(params, "cuda")
    with pytest.raises(ff.backend.BackendError,
                       match="host .NumPy. and GPU .CuPy. arrays.*device_put"):
        model.forward(gpu_params, np.ones((3, 4), np.float32))
    with pytest.raises(ff.backend.BackendError, match="device_put"):
        model.forward(params, cp.ones((3, 4), cp.float32))


def test_device_put_round_trip(cp):
    tree = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [np.ones(2)]}
    back = ff.device_put(ff.device_put(tree, "cuda"), "cpu")
    for a, b in zip(ff.tree.leaves(back), ff.tree.leaves(tree)):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, b)


def test_device_batches_stay_on_gpu_and_cover_the_data(cp):
    x = cp.arange(1000, dtype=cp.float32).reshape(500, 2)
    y = cp.arange(500)
    seen = cp.concatenate([yb for _, yb in ff.data.device_batches(x, y, 64, key=ff.random.key(3))])
    assert len(seen) == 448 and len(cp.unique(seen)) == 448


@pytest.mark.parametrize("activation, own_epilog, path", [
    ("relu", "auto", "own_epilog"), ("relu", "fp32", "split_bias_grad"),
    ("gelu", "auto", "own_epilog"), ("gelu", "fp32", "split_bias_grad")])
def test_large_shape_bias_grad_split_matches_fused(cp, activation, own_epilog, path):
    """Above ``split_bias_grad_macs`` DRELU_BGRAD runs as a plain matmul plus fuseflow's
    in-place mask-and-bias-sum pass (or, with own epilogs only for float32, as DRELU + a
    bias-sum kernel), DGELU_BGRAD likewise with its GELU-derivative pass (or as DGELU +
    the bias-sum kernel): NumPy's results."""
    be = ff.backend.get("cuda")
    rng = np.random.default_rng(0)
    pre = rng.standard_normal((64, 40)).astype(np.float32)
    dy = rng.standard_normal((64, 48)).astype(np.float32)  # 48 > 32: cuBLASLt, not skinny
    w = rng.standard_normal((48, 40)).astype(np.float32)
    np_be = ff.backend.get("numpy")
    _, aux = np_be.activation(pre, activation)
    epilog = "DRELU_BGRAD" if activation == "relu" else "DGELU_BGRAD"
    dx_ref, db_ref = np_be.linear_dgrad(dy, w, epilog, aux)
    _, gaux = be.activation(cp.asarray(pre), activation)
    old = be.split_bias_grad_macs, be.own_epilog, be.own_gemm_max_macs
    try:
        be.split_bias_grad_macs, be.own_epilog, be.own_gemm_max_macs = 1, own_epilog, 0
        before = be.stats()[path]
        dx, db = be.linear_dgrad(cp.asarray(dy), cp.asarray(w), epilog, gaux)
        assert be.stats()[path] == before + 1
    finally:
        be.split_bias_grad_macs, be.own_epilog, be.own_gemm_max_macs = old
    # GELU: cuBLASLt's DGELU approximation differs by up to ~2e-5 per element (docs/gpu.md)
    np.testing.assert_allclose(cp.asnumpy(dx), dx_ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(cp.asnumpy(db), db_ref, rtol=1e-4, atol=1e-2)
