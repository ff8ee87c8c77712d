"""The fused output layer on the GPU (``_cuda_head``): one kernel for the logits, the softmax
cross-entropy and the input gradient with the lower layer's ReLU mask or GELU derivative.

Against the three separate kernels (``FUSEFLOW_FUSED_HEAD=0``'s path): logits, loss
gradient and input gradient bit for bit, the loss and the lower bias gradient (added in
another order) to rounding; with GELU below (the separate input gradient a cuBLASLt
matmul) the grads below the head to rounding; against the NumPy reference to the dtype's
tolerance. Marked
``gpu``; skipped without CuPy, nvmath-python and a GPU."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn
from tests.test_fused_head import make_problem

pytestmark = pytest.mark.gpu

RTOL = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}
# Below a GELU layer the separate path may run cuBLASLt's GELU epilogs, which approximate the
# tanh-GELU (test_gpu_backend.GELU_EPILOG_TOL); the fused kernel and NumPy use the formula.
GELU_RTOL = {np.float16: 2e-2, np.float32: 5e-5, np.float64: 5e-9}


@pytest.fixture
def be(cp, monkeypatch):
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "fused_head", True)
    return be


# (model, input features, batch, classes): the medium and small MNIST heads, odd batches
# (a last block with one row), a head without bias, a lower layer without bias (DRELU
# without BGRAD), a single Dense (no input gradient), generic stages below (no mask)
CASES = {
    "medium": (lambda: nn.Serial(nn.Dense(64, "relu"), nn.Dense(1024, "relu"), nn.Dense(10)),
               784, 256),
    "small": (lambda: nn.Serial(nn.Dense(30, "relu"), nn.Dense(10)), 784, 256),
    "odd_batch": (lambda: nn.Serial(nn.Dense(300, "relu"), nn.Dense(10)), 50, 301),
    "one_row": (lambda: nn.Serial(nn.Dense(40, "relu"), nn.Dense(10)), 20, 1),
    "no_head_bias": (lambda: nn.Serial(nn.Dense(48, "relu"), nn.Dense(7, use_bias=False)),
                     20, 65),
    "no_lower_bias": (lambda: nn.Serial(nn.Dense(48, "relu", use_bias=False), nn.Dense(10)),
                      20, 65),
    "single_dense": (lambda: nn.Serial(nn.Dense(10)), 784, 128),
    "dropout_below": (lambda: nn.Serial(nn.Dense(96, "relu"), nn.Dropout(0.2), nn.Dense(10)),
                      30, 64),
    "classes_32": (lambda: nn.Serial(nn.Dense(256, "relu"), nn.Dense(32)), 64, 100),
    "classes_1": (lambda: nn.Serial(nn.Dense(16, "relu"), nn.Dense(1)), 8, 40),
}


# GELU below: the separate input gradient is then a cuBLASLt matmul (or the own pass after
# a plain one), not the skinny kernel, so the lower layers' grads agree to rounding only.
# 30 and 300 features: a gelu_aux whose columns are round_up(F, 8) apart (cuBLASLt's).
GELU_CASES = {
    "gelu_medium": (lambda: nn.Serial(nn.Dense(64, "gelu"), nn.Dense(1024, "gelu"),
                                      nn.Dense(10)), 784, 256),
    "gelu_small": (lambda: nn.Serial(nn.Dense(30, "gelu"), nn.Dense(10)), 784, 256),
    "gelu_odd_batch": (lambda: nn.Serial(nn.Dense(300, "gelu"), nn.Dense(10)), 50, 301),
    "gelu_no_lower_bias": (lambda: nn.Serial(nn.Dense(48, "gelu", use_bias=False),
                                             nn.Dense(10)), 20, 65),
    "gelu_classes_32": (lambda: nn.Serial(nn.Dense(256, "gelu"), nn.Dense(32)), 64, 100),
}


def problem(cp, name, dtype, seed=0):
    make, features, batch = {**CASES, **GELU_CASES}[name]
    return make_problem(make(), features, batch, dtype, seed, noise=0.05)


def lower_bias(model, params):
    """Index (in the flat leaves) of the bias of the Dense under the head, or None: the
    one gradient the fused kernel adds up in another order."""
    s = model.stages
    if len(s) < 2 or s[-2].dense is None or "b" not in params[s[-2].index]:
        return None
    target = params[s[-2].index]["b"]
    return next(j for j, leaf in enumerate(ff.tree.leaves(params)) if leaf is target)


def run(cp, model, params, x, y, fused_flag, be, monkeypatch, **kw):
    monkeypatch.setattr(be, "fused_head", fused_flag)
    n0 = be.stats()["fused_head"]
    (loss, out), grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy,
                                           with_outputs=True)(
        ff.device_put(params, "cuda"), cp.asarray(x), cp.asarray(y), **kw)
    ran = be.stats()["fused_head"] - n0
    return float(loss), cp.asnumpy(out), [cp.asnumpy(g) for g in ff.tree.leaves(grads)], ran


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_head_equals_the_three_kernels(cp, be, monkeypatch, name, dtype):
    model, params, x, y = problem(cp, name, dtype)
    key = ff.random.key(5)
    loss, out, grads, ran = run(cp, model, params, x, y, True, be, monkeypatch, key=key)
    loss0, out0, grads0, ran0 = run(cp, model, params, x, y, False, be, monkeypatch, key=key)
    assert (ran, ran0) == (1, 0)
    np.testing.assert_array_equal(out, out0)
    rtol = RTOL[dtype]
    np.testing.assert_allclose(loss, loss0, rtol=1e-12 if dtype == np.float64 else 1e-5)
    skip = lower_bias(model, params)
    for j, (a, b) in enumerate(zip(grads, grads0)):
        assert a.dtype == b.dtype == dtype
        if j == skip:  # column sums in another order
            scale = max(1e-30, float(np.abs(b.astype(np.float64)).max()))
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                       rtol=rtol, atol=rtol * scale)
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16],
                         ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", sorted(GELU_CASES))
def test_fused_head_with_gelu_below_equals_the_separate_kernels(cp, be, monkeypatch, name,
                                                                 dtype):
    """Logits and the head's own grads (from the same dy) bit for bit; the loss, and the
    grads below the head (from dx), to the dtype's rounding."""
    model, params, x, y = problem(cp, name, dtype)
    loss, out, grads, ran = run(cp, model, params, x, y, True, be, monkeypatch)
    loss0, out0, grads0, ran0 = run(cp, model, params, x, y, False, be, monkeypatch)
    assert (ran, ran0) == (1, 0)
    np.testing.assert_array_equal(out, out0)
    np.testing.assert_allclose(loss, loss0, rtol=1e-12 if dtype == np.float64 else 1e-5)
    head = len(ff.tree.leaves(params[-1]))  # the head's leaves come last
    rtol = GELU_RTOL[dtype]
    for j, (a, b) in enumerate(zip(grads, grads0)):
        assert a.dtype == b.dtype == dtype
        if j >= len(grads) - head:
            np.testing.assert_array_equal(a, b)
        else:
            scale = max(1e-30, float(np.abs(b.astype(np.float64)).max()))
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                       rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", ["medium", "odd_batch", "no_lower_bias", "dropout_below",
                                  "classes_32", "gelu_medium", "gelu_small",
                                  "gelu_no_lower_bias"])
def test_fused_head_matches_numpy(cp, be, monkeypatch, name, dtype):
    model, params, x, y = problem(cp, name, dtype, seed=1)
    key = ff.random.key(2)
    loss, out, grads, ran = run(cp, model, params, x, y, True, be, monkeypatch, key=key)
    assert ran == 1
    (loss_ref, out_ref), grads_ref = ff.value_and_grad(
        model, ff.losses.softmax_cross_entropy, with_outputs=True)(params, x, y, key=key)
    rtol = 1e-4 if dtype == np.float32 else 10 * GELU_RTOL[dtype] if name in GELU_CASES \
        else 1e-10
    np.testing.assert_allclose(loss, float(loss_ref), rtol=rtol)
    np.testing.assert_allclose(out, out_ref, rtol=rtol, atol=rtol)
    for a, b in zip(grads, ff.tree.leaves(grads_ref)):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


def test_long_batches_keep_the_separate_kernels(cp, be, monkeypatch):
    """Past the short-batch limit (batch x inputs >= 2**21) nothing is fused: the
    tensor-core and vector kernels there stream the activation better."""
    model = nn.Serial(nn.Dense(1024, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (64,))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 64)).astype(np.float32)
    y = rng.integers(0, 10, 2048)
    _, _, _, ran = run(cp, model, params, x, y, True, be, monkeypatch)
    assert ran == 0


@pytest.mark.parametrize("name", ["medium", "gelu_medium"])
@pytest.mark.parametrize("unscaled", [True, False])
def test_mixed_precision_fused_head(cp, be, monkeypatch, unscaled, name):
    """float16 compute with a loss scale: the scaled float16 loss gradient comes out of the
    fused kernel as out of the loss kernel, and the grads equal the unfused path's (with
    GELU below, those under the head to float16 rounding)."""
    model, params, x, y = problem(cp, name, np.float32, seed=3)
    params, x, y = ff.device_put(params, "cuda"), cp.asarray(x), cp.asarray(y)
    scale = cp.asarray(2.0 ** 12, dtype=cp.float32)
    f = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, unscaled=unscaled,
                          with_outputs=True)
    results = {}
    for flag in (True, False):
        monkeypatch.setattr(be, "fused_head", flag)
        n0 = be.stats()["fused_head"]
        (loss, out), grads = f(params, x, y, loss_scale=scale)
        assert be.stats()["fused_head"] - n0 == int(flag)
        results[flag] = (float(loss), cp.asnumpy(out),
                         [cp.asnumpy(g) for g in ff.tree.leaves(grads)])
    (loss, out, grads), (loss0, out0, grads0) = results[True], results[False]
    np.testing.assert_allclose(loss, loss0, rtol=1e-5)
    np.testing.assert_array_equal(out, out0)
    skip = lower_bias(model, params)
    below = len(grads) - len(ff.tree.leaves(params[-1])) if name in GELU_CASES else 0
    for j, (a, b) in enumerate(zip(grads, grads0)):
        assert a.dtype == b.dtype
        if j == skip or j < below:
            scale_b = max(1e-30, float(np.abs(b.astype(np.float64)).max()))
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                       rtol=1e-2, atol=1e-2 * scale_b)
        else:
            np.testing.assert_array_equal(a, b)


def test_fused_head_is_deterministic_and_reentrant(cp, be, monkeypatch):
    """The last block's arrival counter is reset for the next kernel: repeated calls, with
    other ticketed kernels between them, give the same bits."""
    model, params, x, y = problem(cp, "odd_batch", np.float32, seed=4)
    first = run(cp, model, params, x, y, True, be, monkeypatch)
    for _ in range(3):
        again = run(cp, model, params, x, y, True, be, monkeypatch)
        assert again[0] == first[0]
        for a, b in zip(again[2], first[2]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["medium", "gelu_medium"])
@pytest.mark.parametrize("overlap", [False, True])
def test_compiled_step_with_fused_head_equals_eager(cp, be, monkeypatch, overlap, name):
    """In a CUDA graph (the lower bias gradient's sum on the side stream where the weight
    gradients overlap): the same losses as the eager step over 20 steps."""
    monkeypatch.setattr(be, "overlap_wgrad", overlap)
    model, params, x, y = problem(cp, name, np.float32, seed=6)
    opt = ff.optim.adam(1e-3)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def step(p, s, xb, yb):
        loss, grads = grad_fn(p, xb, yb)
        updates, s = opt.update(grads, s, p)
        return ff.optim.apply_updates(p, updates), s, {"loss": loss}

    p0 = ff.device_put(params, "cuda")
    xs, ys = cp.asarray(x), cp.asarray(y)
    pe, se = p0, opt.init(p0)
    eager = []
    for _ in range(20):
        pe, se, m = step(pe, se, xs, ys)
        eager.append(float(m["loss"]))
    compiled = ff.compile(step)
    pc = ff.tree.map(lambda a: a.copy(), p0)
    sc = opt.init(pc)
    n0 = be.stats()["fused_head"]
    graphed = []
    for _ in range(20):
        pc, sc, m = compiled(pc, sc, xs, ys)
        graphed.append(float(m["loss"]))
    assert be.stats()["fused_head"] > n0  # the warm-up and the capture ran it
    np.testing.assert_allclose(graphed, eager, rtol=1e-6)
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(pe)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-5, atol=1e-6)


def test_labels_out_of_range_are_refused_before_the_kernel(cp, be, monkeypatch):
    model, params, x, y = problem(cp, "small", np.float32)
    with pytest.raises(ff.losses.LossError, match=r"labels must lie in \[0, 10\)"):
        run(cp, model, params, x, np.full_like(y, 12), True, be, monkeypatch)
