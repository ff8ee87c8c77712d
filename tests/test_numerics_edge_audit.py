"""Numerics at the edges of the range, on the NumPy backend, against independent float64
NumPy references on fresh random inputs (``rng``): losses with logits of 1e4-1e38, -inf
(masked) classes and float16 logits at +-65504; loss means and LayerNorm param grads over
2**21 rows; LayerNorm on constant, tiny (1e-30, 1e-300) and float16 rows, and an eps that
underflows; GELU/ReLU at exactly 0 and at large |x| (standalone and in the epilogs);
float16 matmuls whose products overflow float16; Dropout near rate 1; empty batches;
accuracy with ties. The cases where fuseflow was wrong are named in each test.
"""

import re

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import losses, nn
from fuseflow.backend import get
from fuseflow.losses import LossError
from fuseflow.nn import LayerError
from tests import reference as ref

be = get("numpy")


def raises(exc, *parts):
    return pytest.raises(exc, match=".*".join(map(re.escape, parts)))


def f64(a):
    return np.asarray(a, np.float64)


def softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


# ---- softmax cross-entropy and sigmoid BCE at extreme logits -------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mag", [1e4, 1e20, 2.5e37])
def test_softmax_xent_huge_logits_and_huge_offsets_vs_float64(rng, dtype, mag):
    """Spread rows (|z| <= mag: one-hot softmax, losses up to 2 * mag; 2.5e37 keeps the sum
    of the 6 losses in float32) and rows of unit spread around an offset of mag (up to 1e6:
    z - max is exact there, so the loss keeps its digits)."""
    spread = rng.uniform(-1, 1, (3, 5)) * mag
    offset = np.sign(rng.standard_normal((3, 1))) * min(mag, 1e6) + rng.standard_normal((3, 5))
    z = np.concatenate([spread, offset]).astype(dtype)
    labels = rng.integers(0, 5, 6)
    loss, g = losses.softmax_cross_entropy(z, labels)
    loss_ref, g_ref = ref.softmax_xent(z, labels)
    assert g.dtype == dtype
    ref.close(loss, loss_ref, 1e-6, 0, "loss", rng.seed)
    ref.close(g, g_ref, 1e-6, 1e-8, "grad", rng.seed)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_xent_minus_inf_logits_mask_classes(rng, dtype):
    """-inf logits (masked classes) get probability 0 and an exact 0 gradient; a label on a
    masked class has loss inf (-log 0) and a finite gradient."""
    z = rng.standard_normal((4, 6)).astype(dtype)
    z[:, [1, 4]] = -np.inf
    labels = np.array([0, 2, 3, 5])
    loss, g = losses.softmax_cross_entropy(z, labels)
    keep = [0, 2, 3, 5]
    loss_ref, g_ref = ref.softmax_xent(z[:, keep], np.arange(4))
    ref.close(loss, loss_ref, 1e-6, 1e-7, "loss", rng.seed)
    tol = 1e-3 if dtype == np.float16 else 1e-7
    ref.close(g[:, keep], g_ref, tol, tol, "grad", rng.seed)
    assert (g[:, [1, 4]] == 0).all()
    loss, g = losses.softmax_cross_entropy(z, np.array([1, 2, 3, 5]))
    assert loss == np.inf and np.isfinite(g).all() and g[0, 1] == np.float16(-0.25)


def test_softmax_xent_float16_logits_at_the_float16_limit(rng):
    z = rng.standard_normal((4, 7)).astype(np.float16)
    z[0, 2], z[0, 5], z[1, 0], z[2, 3], z[3, 1] = 65504, -65504, -65504, 65504, 65504
    labels = np.array([5, 0, 3, 6])
    loss, g = losses.softmax_cross_entropy(z, labels)
    loss_ref, g_ref = ref.softmax_xent(z, labels)
    assert loss.dtype == np.float32 and g.dtype == np.float16
    ref.close(loss, loss_ref, 1e-6, 0, "loss", rng.seed)  # 131008 / 4 + ...: exact in float32
    ref.close(g, g_ref, 1e-3, 1e-4, "grad", rng.seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_xent_one_class_at_extreme_logits(rng, dtype):
    z = (np.sign(rng.standard_normal((5, 1))) * rng.uniform(1e30, 3e38, (5, 1))).astype(dtype)
    loss, g = losses.softmax_cross_entropy(z, np.zeros(5, np.int64))
    assert loss == 0 and (g == 0).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_bce_at_extreme_finite_logits_vs_float64(rng, dtype):
    """Logits up to 65504 (float16), float32's largest value / 64 (the mean's sum of 32
    such losses stays finite) and 1e300, targets 0, 1/2, 1 and random: the loss
    softplus(x) - x t and the gradient sigmoid(x) - t, both finite and exact to rounding."""
    top = {np.float16: 65504.0, np.float32: float(np.finfo(np.float32).max) / 64,
           np.float64: 1e300}[dtype]
    x = np.array([top, -top, top / 3, -top / 3, 1e4, -1e4, 0.5, -0.5])
    x = np.tile(x, (4, 1)).astype(dtype)
    t = np.array([[0.0], [0.5], [1.0], [rng.random()]]) * np.ones(x.shape)
    t = t.astype(dtype)
    loss, g = losses.sigmoid_binary_cross_entropy(x, t)
    x64, t64 = f64(x), f64(t)
    loss_ref = (softplus(x64) - x64 * t64).mean()
    assert np.isfinite(loss) and g.dtype == dtype
    ref.close(loss, loss_ref, 1e-3 if dtype == np.float16 else 1e-6, 0, "loss", rng.seed)
    sig = 0.5 * (1 + np.tanh(x64 / 2))
    ref.close(g, (sig - t64) / x.size, 1e-3, 1e-7, "grad", rng.seed)


def test_accuracy_ties_count_the_first_maximum(rng):
    """Ties go to the first maximal class (NumPy, JAX and PyTorch argmax), in every dtype."""
    z = rng.integers(0, 3, (200, 4)).astype(np.float64)
    labels = rng.integers(0, 4, 200)
    first = np.array([next(j for j in range(4) if row[j] == row.max()) for row in z])
    assert (z == z.max(1, keepdims=True)).sum(1).max() > 1  # ties present
    for dtype in (np.float16, np.float32, np.float64):
        acc = losses.accuracy(z.astype(dtype), labels)
        assert acc == (first == labels).mean(), dtype


def test_loss_means_over_2_21_rows_keep_float32_precision(rng):
    """The mean over a huge float32 batch is summed pairwise: relative error ~1e-7, not the
    ~1e-4 of adding 2**21 rows one after the other."""
    n = 1 << 21
    z = (rng.standard_normal((n, 4)) + 1).astype(np.float32)
    labels = rng.integers(0, 4, n)
    loss, _ = losses.softmax_cross_entropy(z, labels)
    ref.close(loss, ref.softmax_xent(z, labels)[0], 1e-6, 0, "softmax loss", rng.seed)
    zt = (z > 1).astype(np.float32)
    loss, _ = losses.sigmoid_binary_cross_entropy(z.T, zt.T)  # non-contiguous too
    ref.close(loss, (softplus(f64(z)) - f64(z) * zt).mean(), 1e-6, 0, "bce", rng.seed)
    loss, _ = losses.mse(z, zt)
    ref.close(loss, ((f64(z) - zt) ** 2).mean(), 1e-6, 0, "mse", rng.seed)


@pytest.mark.parametrize("fn", [losses.softmax_cross_entropy, losses.accuracy, losses.mse,
                                losses.sigmoid_binary_cross_entropy], ids=lambda f: f.__name__)
def test_outputs_with_no_values_per_sample_are_not_called_an_empty_batch(rng, fn):
    """Was: "got an empty batch ... Fix: skip empty batches" for (3, 0) outputs."""
    out = np.zeros((3, 0), np.float32)
    targets = np.zeros(3, np.int64) if fn in (losses.softmax_cross_entropy,
                                               losses.accuracy) else out
    with raises(LossError, f"{fn.__name__}: outputs of shape (3, 0) hold no values per sample",
                "Fix: give the last layer at least one output"):
        fn(out, targets)


# ---- LayerNorm ---------------------------------------------------------------------------
def layernorm_case(rng, case):
    x = rng.standard_normal((5, 9))
    return {"constant": np.repeat(rng.standard_normal((5, 1)) * 100, 9, axis=1),
            "tiny32": (x * 1e-30).astype(np.float32),
            "tiny64": x * 1e-300,
            "huge32": (x * 1e17).astype(np.float32),
            "huge64": x * 1e150,
            "f16max": np.concatenate([x[:, :7], np.full((5, 1), 65504.0),
                                      np.full((5, 1), -65504.0)], 1).astype(np.float16)}[case]


@pytest.mark.parametrize("case", ["constant", "tiny32", "tiny64", "huge32", "huge64", "f16max"])
def test_layernorm_at_the_edges_of_the_range_vs_float64(rng, case):
    """Constant rows (variance 0: xhat = 0, dx = (dxhat - mean dxhat) / sqrt(eps)), rows whose
    variance underflows (1e-60 < eps: the same), rows of 1e17 (float32) or 1e150 (float64)
    whose squares stay finite, float16 rows at +-65504 (normalized in float32)."""
    x = layernorm_case(rng, case)
    pdt = np.float64 if x.dtype == np.float64 else np.float32
    layer = nn.LayerNorm(param_dtype=pdt)
    p = {"scale": (1 + 0.5 * rng.standard_normal(9)).astype(pdt),
         "bias": (0.5 * rng.standard_normal(9)).astype(pdt)}
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    y, res = layer.forward(p, x)
    grads, dx = layer.backward(p, res, dy)
    y_ref, grad_ref = ref.layernorm(f64(x), f64(p["scale"]), f64(p["bias"]), 1e-5)
    g_ref, _ = grad_ref(f64(dy))
    # dx through the explicit Jacobian r (I - 1/f - xhat xhat^T / f) per row: ref.layernorm's
    # r^3 c c^T form underflows to 0 at 1e150
    c = f64(x) - f64(x).mean(1, keepdims=True)
    r = 1 / np.sqrt((c * c).mean(1) + 1e-5)
    xhat = c * r[:, None]
    dx_ref = np.stack([r[i] * (np.eye(9) - 1 / 9 - np.outer(xhat[i], xhat[i]) / 9)
                       @ (f64(dy[i]) * f64(p["scale"])) for i in range(len(x))])
    tol = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}[x.dtype.type]
    assert y.dtype == x.dtype and dx.dtype == x.dtype
    # tiny rows: an element that nearly cancels the row mean keeps the mean's rounding
    # (float32's eps of the row's scale), so the absolute bound follows the row's scale
    ref.close(res["xhat"], xhat, tol, tol * np.abs(xhat).max() if "tiny" in case else tol,
              "xhat", rng.seed)
    ref.close(y, y_ref, tol, tol, "y", rng.seed)
    ref.close(dx, dx_ref, tol, tol * np.abs(dx_ref).max(), "dx", rng.seed)
    for k in grads:
        ref.close(grads[k], g_ref[k], tol, tol, k, rng.seed)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_layernorm_eps_that_rounds_to_zero_in_float32_is_refused(rng, dtype):
    """Was: LayerNorm(eps=1e-50) normalized float32 (and float16) input with eps = 0, so a
    row of equal values gave NaN silently. float64 input keeps such an eps."""
    layer = nn.LayerNorm(eps=1e-50)
    _, p = layer.init(ff.random.key(0), (4,))
    x = np.repeat(rng.standard_normal((2, 1)), 4, axis=1).astype(dtype)
    with raises(LayerError, "LayerNorm(eps=1e-50): eps rounds to 0 in float32",
                "NaN", "Fix: eps >= 1e-44"):
        layer.forward(p, x)
    ok = nn.LayerNorm(eps=1e-45)  # a subnormal float32 eps still works
    assert (ok.forward(p, x)[0] == 0).all()
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    assert (nn.LayerNorm(eps=1e-50, param_dtype=np.float64).forward(p64, f64(x))[0] == 0).all()


def test_layernorm_param_grads_over_2_21_rows_keep_float32_precision(rng):
    """Was: scale/bias grads summed the rows one by one in float32, 1e-5..7e-5 off (relative)
    over 2**21..2**22 rows; now summed in float64 and rounded once."""
    n = 1 << 21
    layer = nn.LayerNorm()
    _, p = layer.init(ff.random.key(0), (4,))
    x = rng.standard_normal((n, 4)).astype(np.float32)
    dy = (rng.random((n, 4)) + 0.5).astype(np.float32)
    y, res = layer.forward(p, x)
    grads, _ = layer.backward(p, res, dy)
    ref.close(grads["bias"], f64(dy).sum(0), 1e-6, 0, "bias grad", rng.seed)
    prod = f64(dy) * f64(res["xhat"])
    err = np.abs(grads["scale"] - prod.sum(0)) / np.abs(prod).sum(0)
    assert err.max() < 1e-7, f"scale grad error {err} (seed {rng.seed})"


# ---- activations at 0 and at large |x|, standalone and in the epilogs ----------------------
def activation_inputs(rng, dtype):
    big = {np.float16: [100.0, 1e4, 65504.0], np.float32: [1e4, 1e12, 1e18],
           np.float64: [1e4, 1e100, 1e150]}[dtype]
    grid = np.concatenate([[0.0, -0.0], rng.uniform(-12, 12, 60), big, np.negative(big)])
    return grid.reshape(2, -1).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_gelu_and_relu_at_zero_and_large_magnitude_vs_float64(rng, dtype):
    """The tanh GELU and its gradient at +-0 (exactly 0 and 1/2) and up to the largest |x|
    whose square is finite in the compute dtype (float16 computes in float32), standalone and
    through GELU_AUX / DGELU with w = I; ReLU passes its gradient at +-0 and large x."""
    x = activation_inputs(rng, dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    x64, dy64 = f64(x), f64(dy)
    tol = {np.float16: 2e-3, np.float32: 5e-6, np.float64: 1e-14}[dtype]
    eye = np.eye(x.shape[1], dtype=dtype)
    with np.errstate(over="ignore"):  # x**3 overflows to inf: tanh(inf) = 1, as it should
        y, res = nn.GELU().forward({}, x)
        _, dx = nn.GELU().backward({}, res, dy)
        yf, aux = be.linear(x, eye, None, "GELU_AUX")
        dxf, _ = be.linear_dgrad(dy, eye, "DGELU", aux)
        want_y, want_dx = ref.gelu(x64), dy64 * ref.gelu_grad(x64)
    for name, got_y, got_dx in (("standalone", y, dx), ("epilog", yf, dxf)):
        assert got_y[0, 0] == 0 and got_y[0, 1] == 0, name
        assert np.array_equal(got_dx[0, :2], dy[0, :2] * dtype(0.5)), name
        ref.close(got_y, want_y, tol, tol, f"gelu {name}", rng.seed)
        ref.close(got_dx, want_dx, tol, tol, f"gelu grad {name}", rng.seed)
    y, res = nn.ReLU().forward({}, x)
    _, dx = nn.ReLU().backward({}, res, dy)
    np.testing.assert_array_equal(y, np.where(x >= 0, x, 0))
    np.testing.assert_array_equal(dx, np.where(x >= 0, dy, 0))


# ---- Dense in float16: products beyond 65504 accumulate in float32 -------------------------
def test_dense_float16_products_that_overflow_float16_accumulate_in_float32(rng):
    """Integers of magnitude 200-400: most products (up to 160000) overflow float16 but are
    exact in float32, as are their sums; each result is the float64 one rounded once to
    float16 (inf where the sum itself passes 65504), forward, input and weight gradients."""
    def ints(*shape):
        sign = np.where(rng.random(shape) < 0.5, -1, 1)
        return (sign * rng.integers(200, 401, shape)).astype(np.float16)
    x, w, b, dy = ints(64, 2), ints(3, 2), ints(3), ints(64, 3)
    layer = nn.Dense(3, activation="relu", param_dtype=np.float16)
    p = {"w": w, "b": b}
    with np.errstate(over="ignore"):
        y, res = layer.forward(p, x)
        grads, dx = layer.backward(p, res, dy)
        pre = f64(x) @ f64(w).T + f64(b)
        dpre = f64(dy) * (pre >= 0)
        want = {"y": np.maximum(pre, 0), "dx": dpre @ f64(w), "w": dpre.T @ f64(x),
                "b": dpre.sum(0)}
        want = {k: v.astype(np.float16) for k, v in want.items()}
    assert (np.abs(f64(x[:, :1]) * f64(w[:, 0])) > 65504).any()
    assert np.isfinite(want["y"]).mean() > 0.3
    np.testing.assert_array_equal(y, want["y"])
    np.testing.assert_array_equal(dx, want["dx"])
    np.testing.assert_array_equal(grads["w"], want["w"])
    np.testing.assert_array_equal(grads["b"], want["b"])


# ---- Dropout near rate 1 -----------------------------------------------------------------
@pytest.mark.parametrize("rate,dtype", [(0.999, np.float32), (1 - 2.0 ** -20, np.float32),
                                        (0.9999, np.float16)])
def test_dropout_rates_near_one(rng, rate, dtype):
    """Kept elements are scaled by 1 / (1 - rate) rounded once (1e6 in float32, 1e4 in
    float16), the keep fraction is 1 - rate; a factor that overflows the dtype is refused."""
    key = ff.random.key(int(rng.integers(1 << 30)))
    x = rng.standard_normal((1024, 1024)).astype(dtype)
    y, res = nn.Dropout(rate).forward({}, x, key=key)
    keep = ff.random.bits(key, x.shape).astype(np.uint64) < ff.random.keep_threshold(rate)
    factor = dtype(1 / (1 - rate))
    np.testing.assert_array_equal(y, np.where(keep, x * factor, 0).astype(dtype))
    expect = x.size * (1 - rate)
    assert abs(keep.sum() - expect) < 6 * np.sqrt(expect) + 1
    _, dx = nn.Dropout(rate).backward({}, res, x)
    np.testing.assert_array_equal(dx, y)
    with raises(LayerError, "Dropout(0.99999)", "not finite in float16", "Fix:"):
        nn.Dropout(0.99999).forward({}, x[:2].astype(np.float16), key=key)


# ---- empty batches -----------------------------------------------------------------------
@pytest.mark.parametrize("layer,in_shape", [
    (nn.ReLU(), (5,)), (nn.GELU(), (5,)), (nn.ReLU(), (2, 3)), (nn.Flatten(), (2, 3)),
    (nn.Dense(4, "relu"), (5,)), (nn.LayerNorm(), (5,)), (nn.Dropout(0.3), (5,)),
    (nn.Serial(nn.Flatten(), nn.Dense(6, "gelu"), nn.LayerNorm(), nn.ReLU(), nn.Dropout(0.5),
               nn.Dense(4), nn.GELU(), nn.Dense(3)), (2, 3))], ids=repr)
def test_empty_batches_pass_through_every_layer(rng, layer, in_shape):
    """Was: ReLU, GELU and Flatten (and any Serial holding one) failed on 0 rows with
    NumPy's "cannot reshape array of size 0 into shape (0,newaxis)"."""
    out_shape, p = layer.init(ff.random.key(0), in_shape)
    x = np.zeros((0, *in_shape), np.float32)
    key = ff.random.key(1)
    y, res = layer.forward(p, x, key=key)
    assert y.shape == (0, *out_shape) and y.dtype == np.float32
    grads, dx = layer.backward(p, res, np.zeros(y.shape, np.float32))
    assert dx.shape == x.shape
    assert all((g == 0).all() and g.shape == q.shape
               for g, q in zip(ff.tree.leaves(grads), ff.tree.leaves(p)))
    assert layer.apply(p, x, key=key).shape == y.shape
    if isinstance(layer, nn.Serial):  # the loss refuses the empty batch, clearly
        with raises(LossError, "softmax_cross_entropy: got an empty batch", "Fix:"):
            ff.value_and_grad(layer, losses.softmax_cross_entropy)(
                p, x, np.zeros(0, np.int64), key=key)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_gelu_grad_beyond_the_largest_finite_square_is_its_limit(rng, dtype):
    """Was NaN: where x * x overflows, tanh has long saturated and the gradient's second term
    is 0 * inf. Now 1 for large positive x and 0 for large negative x, standalone and
    through DGELU (the NumPy reference of the GPU's epilog and own kernel)."""
    big = {np.float32: [2e19, 1e30, 3e38], np.float64: [2e154, 1e200, 1e308]}[dtype]
    x = np.array([big + [-b for b in big]], dtype=dtype)
    dy = (rng.random(x.shape) + 0.5).astype(dtype)
    want = dy * np.where(x > 0, 1, 0).astype(dtype)
    with np.errstate(over="ignore"):
        _, res = nn.GELU().forward({}, x)
        _, dx = nn.GELU().backward({}, res, dy)
        _, aux = be.linear(x, np.eye(x.shape[1], dtype=dtype), None, "GELU_AUX")
        dxf, _ = be.linear_dgrad(dy, np.eye(x.shape[1], dtype=dtype), "DGELU", aux)
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(dxf, want)
    np.testing.assert_array_equal(ref.gelu_grad(f64(x)), np.where(x > 0, 1.0, 0.0))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_bias_gradient_over_2_21_rows_is_rounded_once(rng, dtype):
    """Was: the NumPy backend's bias gradient added 2^21 rows one by one in float32, 2.9e-5
    (relative) off; now summed in float64 and rounded once (as close as the dtype allows)."""
    n = 1 << 21
    scale = 2.0 ** -8 if dtype == np.float16 else 1.0  # float16 sums stay below 65504
    dy = ((rng.random((n, 4)) + 0.5) * scale).astype(dtype)
    got = be.bias_grad(dy)
    exact = f64(dy).sum(0)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, exact.astype(dtype))
    _, db = be.linear_wgrad(dy, (rng.random((n, 3)) * scale).astype(dtype), "BGRADB")
    np.testing.assert_array_equal(db, exact.astype(dtype))
