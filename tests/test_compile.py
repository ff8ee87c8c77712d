"""ff.compile: pass-through on NumPy; on a GPU, one CUDA graph per step that gives the same
losses as the eager step (GPU tests are marked and skip without a GPU)."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn


def make_problem(sizes=(784, 64, 64, 10), batch=32, seed=0, optimizer=None):
    model = nn.Serial(*[nn.Dense(n, "relu") for n in sizes[1:-1]], nn.Dense(sizes[-1]))
    _, params = model.init(ff.random.key(seed), (sizes[0],))
    opt = optimizer or ff.optim.adam(1e-3)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def step(params, opt_state, x, y):
        loss, grads = grad_fn(params, x, y)
        params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)
        return params, opt_state, {"loss": loss}

    rng = np.random.default_rng(seed)
    xs = rng.random((10, batch, sizes[0]), dtype=np.float32)
    ys = rng.integers(0, sizes[-1], (10, batch))
    return params, opt.init(params), step, xs, ys


def run_side_by_side(step, compiled, params, state, xs, ys, steps):
    """Eager and compiled steps from the same start (the compiled side on copies, as it
    donates them): ``(eager losses, compiled losses, eager params, compiled params)``."""
    pe, se = params, state
    pc, sc = ff.tree.map(lambda a: a.copy(), (params, state))
    eager, graphed = [], []
    for i in range(steps):
        pe, se, me = step(pe, se, xs[i % len(xs)], ys[i % len(ys)])
        pc, sc, mc = compiled(pc, sc, xs[i % len(xs)], ys[i % len(ys)])
        eager.append(float(me["loss"]))
        graphed.append(float(mc["loss"]))
    return eager, graphed, pe, pc


def check_compiled_matches_eager(counter, sizes=(784, 256, 128, 10), batch=64, steps=20):
    """On the GPU: a compiled step of ``make_problem(sizes, batch)`` gives the eager step's
    losses (rtol 1e-5) over ``steps`` steps, compiles once, learns, and the CUDA backend's
    ``stats()[counter]`` grew (the path under test ran)."""
    import cupy

    be = ff.backend.get("cuda")
    params, state, step, xs, ys = make_problem(sizes=sizes, batch=batch)
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cupy.asarray(xs), cupy.asarray(ys)
    n0 = be.stats()[counter]
    compiled = ff.compile(step)
    eager, graphed, _, _ = run_side_by_side(step, compiled, params, state, xs, ys, steps)
    assert be.stats()[counter] > n0
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert compiled.compiles == 1 and eager[-1] < eager[0]


def compiled_runs_by_setting(monkeypatch, attr, opt, steps, step_fn=None, stats=()):
    """``{value: (eager losses, compiled losses, eager params, compiled params, counts)}``
    for the CUDA backend's ``attr`` False and True: a step of 784-512-512-10 at batch 256
    (``step_fn(opt)`` where given) compiled under each, from the same start; ``counts``:
    the backend's ``stats()`` of each name in ``stats``, from the compile on."""
    cp = _cuda()
    be = ff.backend.get("cuda")
    params, state, step, xs, ys = make_problem(sizes=(784, 512, 512, 10), batch=256,
                                               optimizer=opt)
    step = step_fn(opt) if step_fn else step
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cp.asarray(xs), cp.asarray(ys)
    runs = {}
    for value in (False, True):
        monkeypatch.setattr(be, attr, value)
        be.reset_stats()
        compiled = ff.compile(step)
        runs[value] = (*run_side_by_side(step, compiled, params, state, xs, ys, steps),
                       tuple(be.stats()[name] for name in stats))
    return runs


def assert_runs_equal(runs):
    """The True run's compiled losses and params are the False run's, bit for bit."""
    cp = _cuda()
    _, graphed, _, pc, _ = runs[True]
    assert graphed == runs[False][1]
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(runs[False][3])):
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


def test_compile_is_a_pass_through_on_numpy():
    params, state, step, xs, ys = make_problem()
    compiled = ff.compile(step)
    p1, s1, m1 = step(params, state, xs[0], ys[0])
    p2, s2, m2 = compiled(params, state, xs[0], ys[0])
    assert float(m1["loss"]) == float(m2["loss"])
    for a, b in zip(ff.tree.leaves((p1, s1)), ff.tree.leaves((p2, s2))):
        np.testing.assert_array_equal(a, b)
    assert compiled.compiles == 0


@pytest.mark.parametrize("case, match", [
    ("donate_out_of_range", "donate_argnums names argument 5 but the step was called with 4"),
    ("not_a_tuple", "must return a tuple whose first 2 entries"),
    ("changed_structure", "output 1 must have the structure of argument 1"),
    ("changed_dtype", "is .* float64 but the donated input there is .* float32"),
])
def test_compile_checks_its_contract_on_numpy_too(case, match):
    """A step that would fail to compile on a GPU fails on the CPU, on its first call."""
    params, state, step, xs, ys = make_problem()
    compiled = ff.compile(make_bad_step(step, case, np.float64),
                          donate_argnums=(0, 5) if case == "donate_out_of_range" else (0, 1))
    with pytest.raises(ff.CompileError, match=match):
        compiled(params, state, xs[0], ys[0])


def test_compiled_step_takes_keyword_arguments():
    """As jax.jit: keywords bind to the step's positions (donation counts positions)."""
    params, state, step, xs, ys = make_problem()
    compiled = ff.compile(step)
    p1, s1, m1 = compiled(params, state, xs[0], ys[0])
    p2, s2, m2 = compiled(params, opt_state=state, y=ys[0], x=xs[0])
    assert float(m1["loss"]) == float(m2["loss"])
    with pytest.raises(ff.CompileError, match="do not bind to the step's parameters.*Fix: "
                                              "pass the arguments positionally"):
        compiled(params, state, xs[0], ys[0], lr=0.1)

    def with_kw_only(params, opt_state, x, y, *, scale):
        return step(params, opt_state, x * scale, y)

    with pytest.raises(ff.CompileError, match=r"arguments \['scale'\] bind to keyword-only"):
        ff.compile(with_kw_only)(params, state, xs[0], ys[0], scale=np.float32(1))

    def with_defaults(params, opt_state, x, y=None, scale=None):
        return step(params, opt_state, x if scale is None else x * scale, y)

    compiled = ff.compile(with_defaults)  # y given by position, scale skipped: its default
    _, _, m3 = compiled(params, state, xs[0], ys[0])
    _, _, m4 = compiled(params, state, xs[0], y=ys[0], scale=np.float32(1))
    _, _, m5 = compiled(params, state, xs[0], scale=np.float32(1), y=ys[0])
    assert float(m3["loss"]) == float(m4["loss"]) == float(m5["loss"]) == float(m1["loss"])

    def with_kw_only_default(params, opt_state, x, y, *, scale=None):
        return with_defaults(params, opt_state, x, y, scale)

    compiled = ff.compile(with_kw_only_default)  # a keyword-only default not passed: fine
    _, _, m6 = compiled(params, state, x=xs[0], y=ys[0])
    assert float(m6["loss"]) == float(m1["loss"])
    with pytest.raises(ff.CompileError, match=r"arguments \['scale'\] bind to keyword-only"):
        compiled(params, state, x=xs[0], y=ys[0], scale=np.float32(1))


def test_a_python_value_in_a_donated_argument_is_a_clear_error():
    """On a GPU the graph would hand back the value it was compiled with: refused on
    every backend, with the fix."""
    params, state, step, xs, ys = make_problem()

    def counting_step(params, opt_state, x, y):
        p, s, m = step(params, opt_state["opt"], x, y)
        return p, {"opt": s, "n": opt_state["n"] + 1}, m

    with pytest.raises(ff.CompileError, match=r"argument 1 \(donated\) holds the Python value 0 at "
                                              r"'n'.*"
                                              r"Fix: make it a 0-d array, np.asarray\(0\)"):
        ff.compile(counting_step)(params, {"opt": state, "n": 0}, xs[0], ys[0])
    p, s, _ = ff.compile(counting_step)(params, {"opt": state, "n": np.asarray(0)}, xs[0], ys[0])
    assert int(s["n"]) == 1


def test_a_step_that_keeps_compiling_warns_once():
    """A Python number that changes every call is part of the signature (each value is a
    graph on a GPU): the WARN_SIGNATURES-th signature warns, once, with the fix."""
    from fuseflow._compile import WARN_SIGNATURES

    params, state, step, xs, ys = make_problem()

    def scaled_step(params, opt_state, x, y, factor):
        return step(params, opt_state, x * factor, y)

    compiled = ff.compile(scaled_step)
    with pytest.warns(RuntimeWarning, match=f"compiled for {WARN_SIGNATURES} different "
                                            "signatures.*Fix: pass such values as 0-d arrays"):
        for k in range(WARN_SIGNATURES + 3):
            params, state, _ = compiled(params, state, xs[0], ys[0], 1.0 + k / 100)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        compiled(params, state, xs[0], ys[0], 0.5)
        compiled(params, state, xs[0], ys[0], np.float32(0.25))  # a NumPy scalar is a value too


def test_compile_wants_a_function():
    with pytest.raises(TypeError, match="compile: expected the step function, got int"):
        ff.compile(3)


def make_bad_step(step, case, dtype):
    def bad_step(params, opt_state, x, y):
        p, s, m = step(params, opt_state, x, y)
        if case == "not_a_tuple":
            return m
        if case == "changed_structure":
            return p, {"state": s}, m
        if case == "changed_dtype":
            return ff.tree.map(lambda a: a.astype(dtype), p), s, m
        return p, s, m
    return bad_step


gpu = pytest.mark.gpu


def _cuda():
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    return cupy


@gpu
@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw", "clipped_adam", "adam_cosine",
                                      "mixed_adam"])
def test_compiled_step_matches_eager_for_100_steps(opt_name):
    cp = _cuda()
    # lr 0.05 with momentum 0.9 oscillates on this problem (max loss 3.7 on the CPU): the
    # trajectory then depends on rounding; 0.02 descends steadily (2.42 -> 1.0 on the CPU)
    opt = {"sgd": ff.optim.sgd(0.02, momentum=0.9), "adam": ff.optim.adam(1e-3),
           "adamw": ff.optim.adamw(1e-3, weight_decay=1e-2),
           "clipped_adam": ff.optim.chain(ff.optim.clip_by_global_norm(1.0),
                                          ff.optim.adam(1e-3)),
           "adam_cosine": ff.optim.adam(ff.optim.cosine_decay_schedule(1e-3, 100)),
           "mixed_adam": ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3))}[opt_name]
    params, state, step, xs, ys = make_problem(optimizer=opt)
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cp.asarray(xs), cp.asarray(ys)
    compiled = ff.compile(step)
    eager, graphed, pe, pc = run_side_by_side(step, compiled, params, state, xs, ys, 100)
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert compiled.compiles == 1 and eager[-1] < eager[0]
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(pe)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-4, atol=1e-6)


@gpu
def test_compile_with_autotune_times_algorithms_and_matches_eager(monkeypatch):
    """autotune=True re-plans the step's cuBLASLt matmuls with the fastest timed algorithm
    (plans made earlier by the heuristic included); the losses stay those of the eager step."""
    cp = _cuda()
    from fuseflow.backend import _cuda_autotune as tuner

    params, state, step, xs, ys = make_problem(sizes=(784, 256, 64, 10), batch=64)
    params, state = ff.device_put((params, state), "cuda")
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "own_gemm_max_macs", 0)  # float32 through cuBLASLt's plans
    pe, se, me = step(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))  # heuristic plans
    timed, fastest = [], tuner.fastest
    monkeypatch.setattr(tuner, "fastest",
                        lambda mm, algs: timed.append(len(algs)) or fastest(mm, algs))
    compiled = ff.compile(step, autotune=True)
    pc, sc = ff.tree.map(lambda a: a.copy(), (params, state))
    pc, sc, mc = compiled(pc, sc, cp.asarray(xs[0]), cp.asarray(ys[0]))
    assert float(mc["loss"]) == pytest.approx(float(me["loss"]), rel=1e-5)
    # up to five cuBLASLt matmuls (the output layer runs the skinny kernels), all planned
    # first by the eager step's heuristic: re-planned and timed (those with > 1 candidate)
    assert 1 <= len(timed) <= 5 and all(n > 1 for n in timed), timed
    assert be.autotune is False  # the backend's own setting is restored
    for _ in range(5):
        pe, se, me = step(pe, se, cp.asarray(xs[1]), cp.asarray(ys[1]))
        pc, sc, mc = compiled(pc, sc, cp.asarray(xs[1]), cp.asarray(ys[1]))
        assert float(mc["loss"]) == pytest.approx(float(me["loss"]), rel=1e-5)


def test_compile_rejects_an_unknown_autotune_mode():
    with pytest.raises(ValueError, match="autotune must be True, False or 'auto'"):
        ff.compile(lambda p, s, x, y: (p, s, {}), autotune="yes")


@gpu
def test_compile_default_autotunes_only_large_float32_matmuls(monkeypatch):
    """The default ("auto") times candidates for float32 matmuls of 2^32 multiply-adds and
    more (here the first layer's forward and weight gradient), not for the small ones.
    The 3xTF32 kernel is off: on a Hopper GPU it takes those products from cuBLASLt."""
    cp = _cuda()
    from fuseflow.backend import _cuda_autotune as tuner

    monkeypatch.setattr(ff.backend.get("cuda"), "fp32_wgmma", "off")

    timed, fastest = [], tuner.fastest
    monkeypatch.setattr(tuner, "fastest",
                        lambda mm, algs: timed.append(len(algs)) or fastest(mm, algs))
    for sizes, batch, expected in (((1024, 64, 10), 256, 0), ((1024, 1024, 10), 4096, 2)):
        params, state, step, xs, ys = make_problem(sizes=sizes, batch=batch)
        params, state = ff.device_put((params, state), "cuda")
        timed.clear()
        compiled = ff.compile(step)
        pc, sc, mc = compiled(*ff.tree.map(lambda a: a.copy(), (params, state)),
                              cp.asarray(xs[0]), cp.asarray(ys[0]))
        assert len(timed) == expected, (sizes, timed)
        _, _, me = step(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))
        assert float(mc["loss"]) == pytest.approx(float(me["loss"]), rel=1e-5)


def test_compile_autotune_off_while_the_backend_tunes():
    """compile(autotune=False) wins over a backend that autotunes (FUSEFLOW_AUTOTUNE=1):
    warm-up and capture plan alike, so nothing is planned inside the capture."""
    cp = _cuda()
    params, state, step, xs, ys = make_problem(sizes=(784, 128, 64, 10), batch=48)
    params, state = ff.device_put((params, state), "cuda")
    be = ff.backend.get("cuda")
    fallbacks = dict(be.stats()["fallbacks"])
    previous, be.autotune = be.autotune, True
    try:
        compiled = ff.compile(step, autotune=False)
        pc, sc = ff.tree.map(lambda a: a.copy(), (params, state))
        pc, sc, mc = compiled(pc, sc, cp.asarray(xs[0]), cp.asarray(ys[0]))
        assert be.autotune  # restored after compiling
    finally:
        be.autotune = previous
    _, _, me = step(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))
    assert float(mc["loss"]) == pytest.approx(float(me["loss"]), rel=1e-5)
    assert be.stats()["fallbacks"] == fallbacks  # no epilog gave up during the capture


def test_graph_keeps_its_plans_when_the_cache_drops_them():
    """A captured graph replays its cuBLASLt plans' workspaces: clearing the plan cache
    (or an eviction, or an autotune re-plan) must not free them under the graph."""
    cp = _cuda()
    params, state, step, xs, ys = make_problem(sizes=(784, 256, 64, 10), batch=64)
    params, state = ff.device_put((params, state), "cuda")
    compiled = ff.compile(step)
    pe, se = params, state
    pc, sc = ff.tree.map(lambda a: a.copy(), (params, state))
    be = ff.backend.get("cuda")
    for i in range(6):
        pe, se, me = step(pe, se, cp.asarray(xs[i]), cp.asarray(ys[i]))
        pc, sc, mc = compiled(pc, sc, cp.asarray(xs[i]), cp.asarray(ys[i]))
        assert float(mc["loss"]) == pytest.approx(float(me["loss"]), rel=1e-5)
        if i == 1:
            graph = next(iter(compiled._graphs.values()))
            assert graph.plans and all(mm.ff_captured for mm in graph.plans)
            be.clear_plans()  # the graph's plans leave the cache but must stay alive
            cp.get_default_memory_pool().free_all_blocks()
            _ = [cp.full(1 << 18, 7.0, cp.float32) for _ in range(64)]  # reuse free memory


def test_compiled_step_recompiles_on_new_shapes_and_reuses_graphs():
    cp = _cuda()
    params, state, step, xs, ys = make_problem()
    params, state = ff.device_put((params, state), "cuda")
    compiled = ff.compile(step)
    p, s, _ = compiled(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))
    p, s, _ = compiled(p, s, cp.asarray(xs[1]), cp.asarray(ys[1]))
    assert compiled.compiles == 1
    p, s, m = compiled(p, s, cp.asarray(xs[0][:16]), cp.asarray(ys[0][:16]))
    assert compiled.compiles == 2 and np.isfinite(float(m["loss"]))
    compiled(p, s, cp.asarray(xs[2]), cp.asarray(ys[2]))
    assert compiled.compiles == 2


@gpu
def test_host_sync_inside_a_compiled_step_is_a_clear_error():
    cp = _cuda()
    params, state, step, xs, ys = make_problem()

    def bad_step(params, opt_state, x, y):
        p, s, m = step(params, opt_state, x, y)
        return p, s, {"loss": float(m["loss"])}  # reads the GPU on the host

    params, state = ff.device_put((params, state), "cuda")
    with pytest.raises(Exception, match="must not read GPU values on the host"):
        ff.compile(bad_step)(params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))


@gpu
@pytest.mark.parametrize("case, match", [
    ("donate_out_of_range", "donate_argnums names argument 5 but the step was called with 4"),
    ("not_a_tuple", "must return a tuple whose first 2 entries"),
    ("changed_structure", "output 1 must have the structure of argument 1"),
    ("changed_dtype", "is .* float16 but the donated input there is .* float32"),
])
def test_compile_contract_errors_say_what_to_return(case, match):
    cp = _cuda()
    params, state, step, xs, ys = make_problem()
    params, state = ff.device_put((params, state), "cuda")
    donate = (0, 5) if case == "donate_out_of_range" else (0, 1)
    with pytest.raises(ff.CompileError, match=match):
        ff.compile(make_bad_step(step, case, cp.float16), donate_argnums=donate)(
            params, state, cp.asarray(xs[0]), cp.asarray(ys[0]))


@gpu
def test_compiled_float16_step_with_the_update_kernels_compute_copy():
    """make_step in float16 with dynamic_loss_scaling(compute_dtype="float16"): the forward
    runs on the float16 params the update kernel wrote (the graph has no cast of the
    params); losses and params are those of the step that casts every time, bit for bit,
    the compiled step matches the eager one, and compute_params stays params.astype(float16)."""
    cp = _cuda()
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(128, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(1), (784,))
    rng = np.random.default_rng(1)
    xs = cp.asarray(rng.random((10, 64, 784), dtype=np.float32))
    ys = cp.asarray(rng.integers(0, 10, (10, 64)))
    runs = {}
    for copy in (False, True):
        opt = ff.mixed_precision.dynamic_loss_scaling(
            ff.optim.adam(1e-3), compute_dtype="float16" if copy else None)
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="float16")
        p, s = ff.device_put((params, opt.init(params)), "cuda")
        compiled = ff.compile(step)
        runs[copy] = run_side_by_side(step, compiled, p, s, xs, ys, 50)
        eager, graphed, pe, pc = runs[copy]
        np.testing.assert_allclose(graphed, eager, rtol=1e-5)
        assert eager[-1] < eager[0]
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    for a, b in zip(ff.tree.leaves(runs[True][3]), ff.tree.leaves(runs[False][3])):
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


@gpu
def test_donated_leaves_returned_in_each_others_place_swap():
    """A step that returns donated leaves in each other's places (a swap, and a strided view
    of another leaf) gets the eager result: each new value is read before any donated
    buffer is written, also where the copies span many blocks."""
    cp = _cuda()
    n = 1 << 21

    def swap(p, s, x, y):
        new = {"a": p["b"], "b": p["a"], "c": p["d"][::2], "d": p["c"].repeat(2)}
        return new, s, {"n": y.sum() + x.sum()}

    p0 = {"a": cp.arange(n, dtype=cp.float32), "b": -cp.arange(n, dtype=cp.float32),
          "c": cp.arange(n // 2, dtype=cp.float32) + 0.5, "d": cp.arange(n, dtype=cp.float32) * 3}
    ref = ff.tree.map(cp.asnumpy, p0)
    compiled = ff.compile(swap)
    x, y = cp.ones(4, dtype=cp.float32), cp.arange(3)
    p, s = ff.tree.map(lambda a: a.copy(), p0), {"t": cp.zeros(3, dtype=cp.float32)}
    for call in range(3):  # the first call compiles, the next two replay
        p, s, _ = compiled(p, s, x, y)
        ref = {"a": ref["b"], "b": ref["a"], "c": ref["d"][::2], "d": ref["c"].repeat(2)}
        for k in ref:
            np.testing.assert_array_equal(cp.asnumpy(p[k]), ref[k], err_msg=f"{k}, call {call}")


@gpu
def test_batch_copy_kernel_copies_any_bytes():
    """``copy_arrays``: 16-byte words where both addresses allow, bytes elsewhere (odd
    offsets and sizes), more pairs than one launch takes, and empty arrays."""
    cp = _cuda()
    from fuseflow.backend._cuda_graph_inputs import COPY_PAIRS, copy_arrays

    rng = np.random.default_rng(0)
    src = cp.asarray(rng.integers(0, 256, 100_003, dtype=np.uint8))
    dst = cp.zeros(100_010, dtype=cp.uint8)
    views = [(dst[1:50_001], src[2:50_002]), (dst[50_048:50_064], src[16:32]),
             (dst[60_000:60_000], src[0:0]), (dst[50_001:50_034], src[7:40])]
    floats = [(cp.zeros(999, cp.float32), cp.asarray(rng.standard_normal(999, np.float32)))
              for _ in range(COPY_PAIRS)]
    copy_arrays(views + floats)
    for d, s in views + floats:
        np.testing.assert_array_equal(cp.asnumpy(d), cp.asnumpy(s))
    with pytest.raises(ValueError, match="bytes into a"):
        copy_arrays([(dst[:3], src[:4])])


@gpu
def test_graph_copies_each_calls_batch_in():
    """On a GPU with the driver's graph-update calls, the graph copies the batch into its
    input buffers itself (``_cuda_graph_inputs``), repointed before every launch: the losses
    follow the batches handed in (new arrays, the same array refilled in place, a
    non-contiguous view, the graph's own buffer), as the eager step's do."""
    cp = _cuda()
    from fuseflow.backend import _cuda_graph_inputs

    params, state, step, xs, ys = make_problem()
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cp.asarray(xs), cp.asarray(ys)
    compiled = ff.compile(step)
    pc, sc = ff.tree.map(lambda a: a.copy(), (params, state))
    pe, se = params, state
    refill = cp.empty_like(xs[0])
    wide = cp.zeros((xs.shape[1], 2 * xs.shape[2]), dtype=xs.dtype)
    for i in range(8):
        x, y = xs[i % 3], ys[i % 3]
        if i in (3, 4):  # the same array object, refilled in place between calls
            refill[...] = x
            xc = refill
        elif i == 5:  # a non-contiguous view (the slow path copies it contiguous first)
            wide[:, ::2] = x
            xc = wide[:, ::2]
        else:
            xc = x
        pe, se, me = step(pe, se, x, y)
        pc, sc, mc = compiled(pc, sc, xc, y)
        np.testing.assert_allclose(float(mc["loss"]), float(me["loss"]), rtol=1e-5,
                                   err_msg=f"call {i}")
        if i == 0:  # every CUDA 12+ driver has the calls it needs
            assert _cuda_graph_inputs.available() and compiled._last.inputs is not None
    static_x = compiled._last.static_args[2]
    static_x[...] = xs[1]  # the graph's own input buffer, handed in as the batch
    pe, se, me = step(pe, se, xs[1], ys[1])
    pc, sc, mc = compiled(pc, sc, static_x, ys[1])
    np.testing.assert_allclose(float(mc["loss"]), float(me["loss"]), rtol=1e-5)
    with pytest.raises(ff.CompileError, match="argument 2 is a ndarray but the step was "
                                              "compiled for GPU arrays"):
        compiled(pc, sc, cp.asnumpy(xs[0]), ys[0])


@gpu
def test_compiled_step_with_l2_persistence_matches_eager(monkeypatch):
    """``FUSEFLOW_L2_PERSIST=1``: the donated params and optimizer state live side by side
    in one buffer, which the graph's kernels keep in L2; the losses and params are those
    of the eager step."""
    cp = _cuda()
    monkeypatch.setenv("FUSEFLOW_L2_PERSIST", "1")
    params, state, step, xs, ys = make_problem()
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cp.asarray(xs), cp.asarray(ys)
    compiled = ff.compile(step)
    eager, graphed, pe, pc = run_side_by_side(step, compiled, params, state, xs, ys, 30)
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    g = compiled._last
    assert g.capture.persist is not None and 0 < g.capture.persist_hit_ratio <= 1
    start, size = g.capture.persist
    for leaf in ff.tree.leaves((g.static_args[0], g.static_args[1])):
        if isinstance(leaf, cp.ndarray):
            assert start <= leaf.data.ptr and leaf.data.ptr + leaf.nbytes <= start + size
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(pe)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-4, atol=1e-6)


@gpu
def test_l2_persistence_setting(monkeypatch):
    """"auto" keeps a step's donated arrays in L2 where they fit in the L2 the GPU lets be
    set aside; 1 always; 0 (the default) never."""
    _cuda()
    from fuseflow.backend import _cuda_l2

    monkeypatch.delenv("FUSEFLOW_L2_PERSIST", raising=False)
    assert not _cuda_l2.enabled(1 << 20)
    monkeypatch.setenv("FUSEFLOW_L2_PERSIST", "auto")
    assert _cuda_l2.enabled(1 << 20) and not _cuda_l2.enabled(1 << 40)
    monkeypatch.setenv("FUSEFLOW_L2_PERSIST", "1")
    assert _cuda_l2.enabled(1 << 40)
    monkeypatch.setenv("FUSEFLOW_L2_PERSIST", "0")
    assert not _cuda_l2.enabled(1 << 20)
