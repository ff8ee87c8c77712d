"""The optimizer update split at the side stream's join (``_cuda_overlap.SplitPoint``): in
a compiled step, the leaves whose gradients the side stream made are updated there, the
others on the main stream. The numbers must be those of the one-launch update bit for bit,
and the split must only be taken where it is safe. GPU tests are marked and skip without a
GPU; the CPU tests check the parts that need none."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from tests.test_compile import (_cuda, assert_runs_equal, compiled_runs_by_setting, gpu,
                                make_problem, run_side_by_side)


def test_numpy_scopes_take_update_early_and_change_nothing():
    be = ff.backend.get("numpy")
    rng = np.random.default_rng(0)
    dy, x = rng.standard_normal((16, 5)), rng.standard_normal((16, 7))
    with be.overlapping_wgrad(update_early=True):
        dw, db = be.linear_wgrad(dy, x, "BGRADB", overlap=True)
    np.testing.assert_array_equal(dw, dy.T @ x)
    np.testing.assert_allclose(db, dy.sum(axis=0))


@gpu
def test_capture_dependencies_are_read_and_set_in_a_real_capture():
    """The driver queries the split update stands on: inside a capture, the stream's next
    node depends on its last one; after ``set_capture_deps(stream, ())`` the next node is a
    second root of the graph (no edge); outside a capture, no answer."""
    cp = _cuda()
    from fuseflow.backend import _libcuda

    x = cp.ones(1024, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    assert _libcuda.capture_deps(stream.ptr) is None
    assert _libcuda.capture_info(stream.ptr) is None
    with stream:
        stream.begin_capture()
        x += 1
        deps = _libcuda.capture_deps(stream.ptr)
        ident, same = _libcuda.capture_info(stream.ptr)
        cut = _libcuda.set_capture_deps(stream.ptr, ())
        after_cut = _libcuda.capture_deps(stream.ptr)
        x *= 2
        graph = stream.end_capture()
    assert len(deps) == 1 and same == deps and ident is not None
    assert cut and after_cut == ()
    import ctypes

    roots = _libcuda.entry("cuGraphGetRootNodes")
    count = ctypes.c_size_t(0)
    assert roots(ctypes.c_void_p(graph.graph), None, ctypes.byref(count)) == 0
    assert count.value == 2 and len(_libcuda.graph_nodes(graph.graph)) == 2


#: the counters a split-update run reports: (splits taken, of those overlapped in a capture)
SPLIT_STATS = ("split_update", "split_update_overlapped")
OPTIMIZERS = {
    "sgd": lambda: ff.optim.sgd(0.05),
    "momentum": lambda: ff.optim.sgd(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: ff.optim.adam(1e-3),
    # per-leaf weight-decay flags: each launch must get its own leaves' flags
    "adamw_masked": lambda: ff.optim.adamw(
        1e-3, weight_decay=0.1, mask=lambda p: ff.tree.map(lambda a: a.ndim == 2, p)),
    # the step size from the schedule's table, the count advanced by both launches alike
    "adam_schedule": lambda: ff.optim.adam(ff.optim.cosine_decay_schedule(1e-3, 20)),
}


@gpu
@pytest.mark.parametrize("order, streams", [("after", 1), ("early", 1), ("after", 2),
                                            ("early", 2)])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_split_update_equals_one_launch(name, order, streams, monkeypatch):
    """The compiled step with the split gives the one-launch step's losses and params bit
    for bit over 20 steps, and the eager step's losses to 1e-5. It splits twice: in the
    warm-up (events order it) and in the capture (the join taken back). Under "early" the
    side stream's update must also wait for the input gradient that reads its params; with
    two side streams, for both."""
    _cuda()
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "overlap_order", order)
    monkeypatch.setattr(be, "overlap_streams", streams)
    runs = compiled_runs_by_setting(monkeypatch, "split_update", OPTIMIZERS[name](), 20,
                                    stats=SPLIT_STATS)
    eager, graphed, _, _, splits = runs[True]
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert splits == (2, 1) and runs[False][4] == (0, 0)  # (split, of those overlapped)
    assert_runs_equal(runs)


@gpu
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_split_update_takes_compute_copy_bfloat16_grads(name, monkeypatch):
    """compute_copy in bfloat16 (16-bit gradients into the update, the bfloat16 copy
    written beside the params, no finite flag, so the split may be taken): split and one
    launch give the same losses and params bit for bit over 20 steps, and the eager
    step's losses to 1e-5. The weight gradients are forked by request ("auto" overlaps
    full float32 only)."""
    _cuda()
    monkeypatch.setattr(ff.backend.get("cuda"), "overlap_wgrad", True)
    model = nn.Serial(nn.Dense(512, "relu"), nn.Dense(512, "relu"), nn.Dense(10))
    opt = ff.mixed_precision.compute_copy(OPTIMIZERS[name](), "bfloat16")

    def make_step(opt):
        return ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="bfloat16")

    runs = compiled_runs_by_setting(monkeypatch, "split_update", opt, 20,
                                    step_fn=make_step, stats=SPLIT_STATS)
    eager, graphed, _, _, splits = runs[True]
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert splits == (2, 1) and runs[False][4] == (0, 0)
    assert_runs_equal(runs)


@gpu
def test_no_split_after_work_on_the_main_stream(monkeypatch):
    """A step that launches work between the backward and the update (here it reads the
    params) is captured without the split (the join stays), and gives the same numbers.
    Only the warm-up, ordered by events, splits."""
    model = nn.Serial(nn.Dense(512, "relu"), nn.Dense(512, "relu"), nn.Dense(10))
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def make_step(opt):
        def step(params, opt_state, x, y):
            loss, grads = grad_fn(params, x, y)
            norm = sum((p * p).sum() for p in ff.tree.leaves(params))
            params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)
            return params, opt_state, {"loss": loss, "norm": norm}
        return step

    runs = compiled_runs_by_setting(monkeypatch, "split_update", ff.optim.adam(1e-3), 20,
                                    step_fn=make_step, stats=SPLIT_STATS)
    assert runs[True][4] == (1, 0)
    assert_runs_equal(runs)


class ForkingDense(nn.Layer):
    """A custom (non-Dense) layer that overlaps its own weight gradient, then reads its
    weight again on the main stream: the early update of that weight must wait for it."""

    def __init__(self, features):
        super().__init__()
        self.features = features

    def init(self, key, in_shape):
        w = ff.random.normal(key, (self.features, in_shape[-1])) * 0.05
        return (self.features,), {"w": w.astype(np.float32)}

    def forward(self, params, x, *, key=None, train=True):
        be = ff.backend.of(x, params["w"], where="ForkingDense")
        y, _ = be.linear(x, params["w"], None, "DEFAULT")
        return y, {"x": x}

    def backward(self, params, residuals, dy):
        be = ff.backend.of(dy, params["w"], where="ForkingDense")
        dw, _ = be.linear_wgrad(dy, residuals["x"], "DEFAULT", overlap=True)
        dx, _ = be.linear_dgrad(dy, params["w"], "DEFAULT")
        dx = dx + 0.0 * (params["w"] * params["w"]).sum()  # reads w after the fork
        return {"w": dw}, dx


@gpu
def test_custom_layer_forking_its_weight_gradient_splits_safely(monkeypatch):
    """A custom layer below the Dense stages forks its weight gradient and reads its
    weight after that; Serial records its whole backward as a read, and the split update
    gives the one launch's numbers."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    model = nn.Serial(nn.Dense(512, "relu"), ForkingDense(512), nn.ReLU(),
                      nn.Dense(512, "relu"), nn.Dense(10))
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def make_step(opt):
        def step(params, opt_state, x, y):
            loss, grads = grad_fn(params, x, y)
            params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)
            return params, opt_state, {"loss": loss}
        return step

    opt = ff.optim.adam(1e-3)
    _, params = model.init(ff.random.key(0), (784,))
    rng = np.random.default_rng(0)
    xs = cp.asarray(rng.random((10, 256, 784), dtype=np.float32))
    ys = cp.asarray(rng.integers(0, 10, (10, 256)))
    params = ff.device_put(params, "cuda")
    state = opt.init(params)
    runs = {}
    for split in (False, True):
        monkeypatch.setattr(be, "split_update", split)
        be.reset_stats()
        step = make_step(opt)
        runs[split] = (*run_side_by_side(step, ff.compile(step), params, state, xs, ys, 20),
                       be.stats()["split_update"])
    assert runs[True][4] == 2 and runs[False][4] == 0
    assert_runs_equal(runs)


@gpu
@pytest.mark.parametrize("case", ["before", "no_overlap", "float16"])
def test_no_split_where_it_is_not_safe(case, monkeypatch):
    """No split under the overlap order "before" (not taken: its lowest layer's weight
    gradient queues on the side stream, so the side's update could not start before the
    main stream's work ends), without overlapped weight gradients, or under loss scaling
    (the update is skipped on non-finite gradients of every leaf)."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "split_update", True)
    if case == "before":
        monkeypatch.setattr(be, "overlap_order", "before")
    if case == "no_overlap":
        monkeypatch.setattr(be, "overlap_wgrad", False)
    opt = ff.optim.adam(1e-3)
    if case == "float16":
        monkeypatch.setattr(be, "overlap_wgrad", True)  # overlapped, yet no split
        opt = ff.mixed_precision.dynamic_loss_scaling(opt)
        params, state, _, xs, ys = make_problem(sizes=(784, 512, 512, 10), batch=256,
                                                optimizer=opt)
        model = nn.Serial(nn.Dense(512, "relu"), nn.Dense(512, "relu"), nn.Dense(10))
        grad_fn = ff.mixed_precision.value_and_grad(model, ff.losses.softmax_cross_entropy,
                                                    "float16", unscaled=False)

        def step(p, s, x, y):
            loss, g = grad_fn(p, x, y, loss_scale=s.scale)
            p, s = ff.mixed_precision.update_and_apply_scaled(opt, g, s, p)
            return p, s, {"loss": loss}
    else:
        params, state, step, xs, ys = make_problem(sizes=(784, 512, 512, 10), batch=256,
                                                   optimizer=opt)
    params, state = ff.device_put((params, state), "cuda")
    be.reset_stats()
    compiled = ff.compile(step)
    for i in range(3):
        params, state, _ = compiled(params, state, cp.asarray(xs[i]), cp.asarray(ys[i]))
    assert be.stats()["split_update"] == 0
    if case != "no_overlap":
        assert be.stats()["overlapped_wgrad"] > 0


@gpu
def test_fit_compiled_splits_and_matches_eager(monkeypatch):
    """``fit(compiled=True)`` (make_step: the update right after the backward) takes the
    split, and its losses match the eager fit's."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "split_update", True)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1024, 64), dtype=np.float32)
    y = rng.integers(0, 10, 1024)
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(256, "relu"), nn.Dense(10))
    losses = {}
    for compiled in (False, True):
        opt = ff.optim.adam(1e-3)
        state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
        state = state._replace(params=ff.device_put(state.params, "cuda"),
                               opt_state=ff.device_put(state.opt_state, "cuda"))
        be.reset_stats()
        result = ff.train.fit(model, opt, state, (cp.asarray(x), cp.asarray(y)), epochs=2,
                              batch_size=128, compiled=compiled, progress=False, log=None)
        losses[compiled] = [r["train_loss"] for r in result.history]
        assert (be.stats()["split_update"] > 0) == compiled
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)


@gpu
@pytest.mark.parametrize("setting, sizes, expected", [
    ("auto", (784, 512, 512, 10), 2), ("auto", (784, 30, 10), 0), (True, (784, 30, 10), 2)])
def test_auto_splits_only_large_early_leaves(setting, sizes, expected, monkeypatch):
    """"auto" (the default) splits where the side stream's leaves hold at least
    ``split_update_min_elements`` (the 512-wide model's 267K; not 784-30-10's few hundred, whose
    update is shorter than a launch: measured slower split)."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "split_update", setting)
    params, state, step, xs, ys = make_problem(sizes=sizes, batch=256)
    params, state = ff.device_put((params, state), "cuda")
    be.reset_stats()
    compiled = ff.compile(step)
    compiled(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))
    assert be.stats()["split_update"] == expected
