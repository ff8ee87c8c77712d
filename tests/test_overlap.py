"""Weight gradients overlapped on a second stream (``fuseflow.backend._cuda_overlap``): the
same numbers as on one stream, eager and compiled, read right after the backward returns;
only Serial's plain Dense stages overlap. GPU tests are marked and skip without a GPU."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow.nn._serial import _overlappable
from tests.test_compile import _cuda, assert_runs_equal, compiled_runs_by_setting, gpu


class DoubledGrads(nn.Dense):
    """A Dense whose backward reads its own weight gradient (doubles it) before returning."""

    def backward_fused(self, params, residuals, dy=None, **kwargs):
        grads, dx, db = super().backward_fused(params, residuals, dy, **kwargs)
        return {k: v * 2 for k, v in grads.items()}, dx, db


def test_only_plain_dense_stages_overlap():
    assert _overlappable(nn.Dense(4))
    assert not _overlappable(DoubledGrads(4))


def test_numpy_overlap_is_the_plain_weight_gradient():
    be = ff.backend.get("numpy")
    rng = np.random.default_rng(0)
    dy, x = rng.standard_normal((16, 5)), rng.standard_normal((16, 7))
    with be.overlapping_wgrad():
        dw, db = be.linear_wgrad(dy, x, "BGRADB", overlap=True)
    dw0, db0 = be.linear_wgrad(dy, x, "BGRADB")
    np.testing.assert_array_equal(dw, dw0)
    np.testing.assert_array_equal(db, db0)


MODELS = {
    # cuBLASLt matmuls, the skinny output layer, DRELU_BGRAD between the hidden layers
    "mlp": (lambda: nn.Serial(nn.Dense(1024, "relu"), nn.Dense(1024, "relu"), nn.Dense(10)),
            784, 256),
    # equal widths and a long weight gradient: without the scope keeping each layer's input
    # alive, the input gradient reuses its memory while the side stream still reads it
    "wide": (lambda: nn.Serial(nn.Dense(2048, "relu"), nn.Dense(2048, "relu"),
                               nn.Dense(2048, "relu"), nn.Dense(30)), 2048, 4096),
    # a nested Serial joins its own scope; a separate ReLU layer fuses; LayerNorm runs between
    "nested": (lambda: nn.Serial(nn.Dense(512), nn.ReLU(), nn.LayerNorm(),
                                 nn.Serial(nn.Dense(512, "relu"), nn.Dense(10))), 300, 128),
    # a Dense subclass reading its grads in its backward stays on the main stream
    "subclass": (lambda: nn.Serial(nn.Dense(512, "relu"), DoubledGrads(512, "relu"),
                                   nn.Dense(10)), 300, 128),
    # ... while the Dense above it, of the same shape, runs its weight gradient on the side
    # stream at the same time: the two must not share a plan (and its workspace)
    "shared_shape": (lambda: nn.Serial(nn.Dense(512, "relu"), DoubledGrads(512, "relu"),
                                       nn.Dense(512, "relu"), nn.Dense(10)), 512, 1024),
}
OVERLAPPED = {"mlp": 3, "wide": 4, "nested": 1 + 2, "subclass": 2, "shared_shape": 3}


@gpu
@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("order", ["before", "after", "early"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_overlapped_grads_equal_one_stream(name, order, streams, monkeypatch):
    """Every overlap order gives the one stream's numbers bit for bit. "before" forks
    every plain Dense stage's weight gradient; "after" (the default: forked once the input
    gradient is issued) and "early" (forked before it) run the lowest layer's on the main
    stream."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    make, features, batch = MODELS[name]
    model = make()
    _, params = model.init(ff.random.key(1), (features,))
    params = ff.device_put(params, "cuda")
    rng = np.random.default_rng(2)
    x = cp.asarray(rng.standard_normal((batch, features), dtype=np.float32))
    y = cp.asarray(rng.integers(0, 10, batch))
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    monkeypatch.setattr(be, "overlap_wgrad", False)
    loss0, g0 = grad_fn(params, x, y)
    g0 = [cp.asnumpy(a) for a in ff.tree.leaves(g0)]
    monkeypatch.setattr(be, "overlap_wgrad", True)
    monkeypatch.setattr(be, "overlap_order", order)
    monkeypatch.setattr(be, "overlap_streams", streams)  # 2: forks alternate between two
    for _ in range(3):
        be.reset_stats()
        loss1, g1 = grad_fn(params, x, y)
        # read at once, on the main stream: the scope's join must already order it
        got = [cp.asnumpy(a) for a in ff.tree.leaves(g1)]
        n = be.stats()["overlapped_wgrad"]
        assert n == OVERLAPPED[name] if order == "before" else 0 < n < OVERLAPPED[name]
        assert float(loss1) == float(loss0)
        for a, b in zip(got, g0):
            np.testing.assert_array_equal(a, b)


@gpu
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_compiled_step_overlapped_equals_one_stream(opt_name, monkeypatch):
    """Two graphs, captured with and without the side stream, from the same start: the
    same losses and parameters bit for bit over 30 steps; each equals the eager step."""
    opt = ff.optim.sgd(0.05) if opt_name == "sgd" else ff.optim.adam(1e-3)
    runs = compiled_runs_by_setting(monkeypatch, "overlap_wgrad", opt, 30,
                                    stats=("overlapped_wgrad",))
    for overlap in (False, True):
        assert (runs[overlap][4][0] > 0) == overlap
    eager, graphed, _, _, _ = runs[True]
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert_runs_equal(runs)


@gpu
@pytest.mark.parametrize("case, expected", [("float32", 2), ("tf32", 0), ("float16", 0),
                                            ("over_max_bytes", 1)])
def test_auto_overlaps_small_full_float32_weight_gradients(case, expected, monkeypatch):
    """"auto": full float32 only (TF32 steps measured slower overlapped), and only inputs
    of up to ``overlap_max_bytes`` (here set between the output layer's 522 KB and the
    hidden layers' 1 MB and more). The lowest layer's runs on the main stream (the default
    overlap orders "after" and "early", the default)."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    assert be.overlap_order in ("after", "early")
    monkeypatch.setattr(be, "overlap_wgrad", "auto")
    monkeypatch.setattr(be, "tf32", case == "tf32")
    if case == "over_max_bytes":
        monkeypatch.setattr(be, "overlap_max_bytes", 600 * 1024)
    dtype = np.float16 if case == "float16" else np.float32
    model = nn.Serial(nn.Dense(512, "relu"), nn.Dense(512, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(1), (784,))
    params = ff.tree.map(lambda a: cp.asarray(a, dtype=dtype), params)
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal((256, 784)), dtype=dtype)
    y = cp.asarray(rng.integers(0, 10, 256))
    be.reset_stats()
    ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(params, x, y)
    assert be.stats()["overlapped_wgrad"] == expected
