"""``ff.compile(..., cast_args=...)``: batch arguments cast on their way in.

The step sees the cast arguments, as ``step(..., x.astype(dtype), ...)`` would; on the GPU
the graph's copy of the batch casts while it copies. A mixed-precision step, which casts
its batch first thing, gives the same losses and params bit for bit with and without it.
GPU tests are marked and skip without a GPU."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from tests.reference import same_bits_or_both_nan

gpu = pytest.mark.gpu


def mixed_problem(seed=1, batch=64, sizes=(784, 256, 128, 10)):
    """A float16 make_step (Adam under dynamic loss scaling, with the compute copy) and
    fresh float32 batches: the step casts each batch to float16 first thing."""
    model = nn.Serial(*[nn.Dense(n, "relu") for n in sizes[1:-1]], nn.Dense(sizes[-1]))
    _, params = model.init(ff.random.key(seed), (sizes[0],))
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3), compute_dtype="float16")
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="float16")
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((6, batch, sizes[0]), dtype=np.float32)
    ys = rng.integers(0, sizes[-1], (6, batch))
    return params, opt.init(params), step, xs, ys


def run(compiled, params, state, xs, ys, steps):
    """``(losses, params, opt_state)`` after ``steps`` calls, a new batch each call."""
    losses = []
    for i in range(steps):
        params, state, m = compiled(params, state, xs[i % len(xs)], ys[i % len(ys)])
        losses.append(float(m["loss"]))
    return losses, params, state


def assert_trees_equal(a, b, to_host=np.asarray):
    for u, v in zip(ff.tree.leaves(a), ff.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(to_host(u), to_host(v))


# ---- NumPy: the pass-through casts too --------------------------------------------------------
def test_the_step_sees_the_cast_arguments_on_numpy():
    seen = []

    def step(p, s, x, y):
        seen.append((x.dtype, x.flags.c_contiguous, y.dtype))
        return p, s, {"x": x.sum(dtype=np.float64)}

    p, s = {"w": np.ones(3, np.float32)}, {"t": np.zeros((), np.int32)}
    x = np.random.default_rng(0).standard_normal((5, 8))[:, ::2]  # float64, strided
    y = np.arange(5)
    _, _, m = ff.compile(step, cast_args={2: "float16"})(p, s, x, y)
    assert seen == [(np.float16, True, y.dtype)]
    assert float(m["x"]) == x.astype(np.float16).sum(dtype=np.float64)
    seen.clear()
    ff.compile(step)(p, s, x, y)  # without cast_args the step gets x as it is
    assert seen == [(np.float64, False, y.dtype)]


def test_mixed_precision_step_is_unchanged_by_casting_its_batch_on_numpy():
    """The step would cast the batch to float16 itself: casting it on the way in gives the
    same losses and params, bit for bit (that the cast happens: the test above)."""
    params, state, step, xs, ys = mixed_problem(batch=16, sizes=(784, 32, 10))
    ref = run(ff.compile(step), params, state, xs, ys, 5)
    cast = run(ff.compile(step, cast_args={2: np.float16}), params, state, xs, ys, 5)
    assert cast[0] == ref[0]
    assert_trees_equal(cast[1:], ref[1:])


@pytest.mark.parametrize("cast_args, error, match", [
    ({0: "float16"}, ValueError, "names argument 0, which is donated"),
    ({2: "int32"}, ValueError, r"cast_args\[2\] must be one of \['float16', 'bfloat16', "
                               r"'float32', 'float64'\], got 'int32'"),
    ({2: "float8_e4m3fn"}, ValueError, "got 'float8_e4m3fn'"),
    ({2: None}, ValueError, "got None"),
    ([2], TypeError, "must be a dict"),
    ({"x": "float16"}, TypeError, r"keys must be argument indices \(ints >= 0\), got 'x'"),
    ({True: "float16"}, TypeError, "got True"),
    ({-1: "float16"}, TypeError, "got -1"),
])
def test_bad_cast_args_are_named_at_compile(cast_args, error, match):
    with pytest.raises(error, match=match):
        ff.compile(lambda p, s, x, y: (p, s, {}), cast_args=cast_args)


@pytest.mark.parametrize("x, got", [
    (np.arange(6).reshape(2, 3), "an array of dtype int64"),
    ([1.0, 2.0], "a list"),
])
def test_a_cast_argument_must_be_a_float_array(x, got):
    compiled = ff.compile(lambda p, s, x, y: (p, s, {}), cast_args={2: "float16"})
    with pytest.raises(ff.CompileError, match=f"cast_args names argument 2, which is {got}; "
                                              "it casts float16, bfloat16, float32 or "
                                              "float64 arrays"):
        compiled({"w": np.ones(2)}, {}, x, np.zeros(2))
    with pytest.raises(ff.CompileError, match="names argument 2, which is missing"):
        compiled({"w": np.ones(2)}, {})


def test_batch_casts_names_the_batch_of_a_mixed_precision_step():
    x = np.zeros((2, 3), np.float32)
    assert ff.train.batch_casts("float16", x, 2) == {2: np.dtype(np.float16)}
    assert ff.train.batch_casts(np.float16, x, 3) == {3: np.dtype(np.float16)}
    assert ff.train.batch_casts(None, x, 2) is None  # float32: the step uses x as given
    assert ff.train.batch_casts("float32", x, 2) is None
    assert ff.train.batch_casts("float16", x.astype(np.int64), 2) is None  # token ids
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        ff.train.batch_casts("float8_e4m3fn", x, 2)


# ---- GPU: the graph's copy casts ---------------------------------------------------------------
@gpu
@pytest.mark.parametrize("src, dst", [(a, b) for a in ("float16", "float32", "float64")
                                      for b in ("float16", "float32", "float64") if a != b])
def test_copy_kernel_casts_as_astype_does(cp, src, dst):
    """Every conversion, 8 elements a step where both addresses allow and one at a time
    elsewhere (odd offsets and lengths), bit for bit what CuPy's astype gives (a NaN as
    any NaN), including values that overflow float16, its subnormals, signed zeros,
    infinities and NaN, and float64 values that round to another float16 directly than
    through float32 (the copy must round once). Two pairs of 4.2M elements make every
    thread of the grid-stride loops (vector and scalar) take two steps or more, as a real
    batch does."""
    from fuseflow.backend._cuda_graph_inputs import COPY_PAIRS, copy_arrays

    rng = np.random.default_rng(7)
    # 1 + 2**-11 + 2**-40: float16 1 + 2**-10 directly, 1.0 through float32 (a tie there)
    once = np.array([1, -1, 2**-3, 2**9, 2**-14]) * (1 + 2.0**-11 + 2.0**-40)
    special = np.array([0.0, -0.0, 1e-7, -3e-8, 6e-5, 65504.0, 65520.0, 1e5, -1e9, np.inf,
                        -np.inf, np.nan, 1 / 3, 2049.0, 4097.0, *once], dtype=np.float64)
    if src == "float64" and dst == "float16":
        twice = np.float64(once).astype(np.float32).astype(np.float16)
        assert (np.float64(once).astype(np.float16) != twice).all()  # the values tell
    host = np.concatenate([special, rng.standard_normal(10_007) * 300]).astype(src)
    s = cp.asarray(host)
    pieces = [(0, len(host)), (1, 1_001), (3, 3 + 8 * 9 + 5), (8, 8), (16, 4_113)]
    pairs = [(cp.full(b - a, 7, dtype=dst), s[a:b]) for a, b in pieces]
    wide = cp.full(len(host) + 1, 7, dtype=dst)
    pairs.append((wide[1:], s))  # an aligned source into a misaligned destination
    big = cp.asarray(rng.standard_normal(4_200_001).astype(src))
    pairs.append((cp.full(big.size, 7, dtype=dst), big))  # vector loop, several steps
    wide = cp.full(big.size, 7, dtype=dst)
    pairs.append((wide[1:], big[:-1]))  # scalar loop (misaligned), several steps
    assert len(pairs) > COPY_PAIRS  # two launches
    copy_arrays(pairs)
    for d, v in pairs:
        # a NaN's payload may differ: for float32's quiet NaN 0x7FC00000 CuPy's astype
        # (compiled with -ftz=true) gave 0x7FFFFFFFE0000000, the copy's exact widening
        # (cvt without .ftz) 0x7FF8000000000000, as NumPy's (call 133)
        same_bits_or_both_nan(cp.asnumpy(d), cp.asnumpy(v.astype(dst)))


@gpu
def test_copy_kernel_names_what_it_cannot_copy(cp):
    from fuseflow.backend._cuda_graph_inputs import copy_arrays

    with pytest.raises(ValueError, match="10 elements into a 9-element buffer"):
        copy_arrays([(cp.zeros(9, cp.float16), cp.zeros(10, cp.float32))])
    with pytest.raises(ValueError, match="cannot cast int32 to float16"):
        copy_arrays([(cp.zeros(4, cp.float16), cp.zeros(4, cp.int32))])


@gpu
@pytest.mark.parametrize("in_graph, in_copy", [(True, True), (False, True), (True, False)])
def test_compiled_mixed_precision_step_with_its_batch_cast_on_the_way_in(cp, monkeypatch,
                                                                         in_graph, in_copy):
    """The float16 make_step compiled with ``cast_args={2: float16}`` gives the losses and
    params of the same step compiled without it (which casts inside the graph), bit for bit,
    over new float32 batches each call. The graph keeps only a float16 batch buffer, which
    its first node casts into where the driver allows (``IN_GRAPH``; otherwise each call
    casts it in); with ``CAST_IN_COPY`` off it keeps the float32 batch and casts it itself."""
    from fuseflow.backend import _cuda_graph_inputs

    monkeypatch.setattr(_cuda_graph_inputs, "IN_GRAPH", in_graph)
    monkeypatch.setattr(_cuda_graph_inputs, "CAST_IN_COPY", in_copy)
    params, state, step, xs, ys = mixed_problem()
    p, s = ff.device_put((params, state), "cuda")
    batches = [cp.asarray(x) for x in xs]
    labels = [cp.asarray(y) for y in ys]
    runs = {}
    for casts in (None, {2: "float16"}):
        compiled = ff.compile(step, cast_args=casts)
        start = ff.tree.map(lambda a: a.copy(), (p, s))
        runs[bool(casts)] = run(compiled, *start, batches, labels, 20)
        g = compiled._last
        assert g.static_args[2].dtype == (cp.float16 if casts and in_copy else cp.float32)
        assert (g.inputs is not None) == in_graph
        assert compiled.compiles == 1 and compiled._last is g  # one graph, the fast path's
    assert runs[True][0] == runs[False][0]
    assert runs[True][0][-1] < runs[True][0][0]
    assert_trees_equal(runs[True][1:], runs[False][1:], cp.asnumpy)


@gpu
def test_cast_batch_follows_each_calls_array(cp):
    """The cast copy is repointed at each call's batch (new arrays, one array refilled in
    place, a strided view), and a batch already in the cast dtype compiles a graph of its
    own that copies it as it is: the losses follow the eager step given the cast batch."""
    params, state, step, xs, ys = mixed_problem(batch=32)
    p, s = ff.device_put((params, state), "cuda")
    compiled = ff.compile(step, cast_args={2: "float16"})
    pc, sc = ff.tree.map(lambda a: a.copy(), (p, s))
    pe, se = p, s
    refill = cp.empty(xs[0].shape, dtype=cp.float32)
    wide = cp.zeros((xs.shape[1], 2 * xs.shape[2]), dtype=cp.float32)
    for i in range(7):
        x, y = cp.asarray(xs[i % 3]), cp.asarray(ys[i % 3])
        if i in (2, 3):
            refill[...] = x
            xc = refill
        elif i == 4:
            wide[:, ::2] = x
            xc = wide[:, ::2]
        elif i == 6:
            xc = x.astype(cp.float16)
        else:
            xc = x
        pe, se, me = step(pe, se, x.astype(cp.float16), y)
        pc, sc, mc = compiled(pc, sc, xc, y)
        # another batch's loss differs by about 1%: eager and compiled agree to rounding
        np.testing.assert_allclose(float(mc["loss"]), float(me["loss"]), rtol=1e-5,
                                   err_msg=f"call {i}")
    assert compiled.compiles == 2  # the float16 batch is its own signature


# ---- fit: a mixed-precision run compiles its step with the batch cast --------------------------
def _fit_float16(monkeypatch, compiled, device=None):
    """One epoch of ``fit`` in float16 on the digits; ``(result, cast_args of each compile)``."""
    import fuseflow.train._fit as fit_module

    seen = []
    real = fit_module.compile_step
    monkeypatch.setattr(fit_module, "compile_step",
                        lambda *a, **kw: seen.append(kw.get("cast_args")) or real(*a, **kw))
    train, test = ff.data.digits("train"), ff.data.digits("test")
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10))
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(3e-3), compute_dtype="float16")
    state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
    if device == "cuda":
        state = state._replace(params=ff.device_put(state.params, "cuda"),
                               opt_state=ff.device_put(state.opt_state, "cuda"))
    result = ff.train.fit(model, opt, state, train, test, epochs=2, batch_size=100,
                          compute_dtype="float16", compiled=compiled, progress=False, log=None)
    return result, seen


def test_compiled_float16_fit_casts_the_batch_and_matches_the_plain_loop(monkeypatch):
    """On NumPy ``compile`` is a pass-through that casts the batch as the graph would: the
    run is the uncompiled one, bit for bit."""
    plain, seen = _fit_float16(monkeypatch, False)
    assert seen == []
    compiled, seen = _fit_float16(monkeypatch, True)
    assert seen == [{3: np.dtype(np.float16)}]  # (params, opt_state, sums, x, y)
    kept = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc")  # not times
    assert [[r[k] for k in kept] for r in compiled.history] == \
        [[r[k] for k in kept] for r in plain.history]
    assert_trees_equal(compiled.state, plain.state)


@gpu
def test_compiled_float16_fit_on_the_gpu_matches_the_eager_loop(cp, monkeypatch):
    eager, _ = _fit_float16(monkeypatch, False, "cuda")
    compiled, seen = _fit_float16(monkeypatch, True, "cuda")
    assert seen == [{3: np.dtype(np.float16)}]
    for a, b in zip(compiled.history, eager.history, strict=True):
        for key in ("train_loss", "test_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
        for key in ("train_acc", "test_acc"):  # one prediction flipped by rounding: 1/1400
            assert a[key] == pytest.approx(b[key], abs=1.5e-3), key
    assert compiled.history[1]["train_loss"] < compiled.history[0]["train_loss"]


@gpu
def test_cast_of_a_later_batch_argument_from_float64(cp):
    """A cast argument that is the batch copy's third pair (after y and a key-like array),
    from float64: the step gets ``x.astype(float16)``, call after call."""
    seen = []

    def step(p, s, y, k, x):
        seen.append(x.dtype)
        return p, s, {"sum": x.astype(cp.float32).sum() + y.sum() + k.sum()}

    compiled = ff.compile(step, cast_args={4: "float16"})
    p, s = {"w": cp.ones(3, cp.float32)}, {"t": cp.zeros((), cp.int32)}
    rng = np.random.default_rng(3)
    for i in range(4):
        x = cp.asarray(rng.standard_normal((64, 40)) * 100)  # float64
        y, k = cp.arange(64) + i, cp.full(2, i, dtype=cp.uint32)
        p, s, m = compiled(p, s, y, k, x)
        want = x.astype(cp.float16).astype(cp.float32).sum() + y.sum() + k.sum()
        assert float(m["sum"]) == float(want), f"call {i}"
    assert seen == [cp.float16, cp.float16]  # the warm-up and the capture, then replays
    assert compiled._last.inputs is not None
