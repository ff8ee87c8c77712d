"""update_and_apply: the one-launch optimizer kernels agree with the reference transforms."""

import numpy as np
import pytest

import fuseflow as ff

OPTIMIZERS = {
    "sgd": lambda: ff.optim.sgd(0.1),
    "sgd_schedule": lambda: ff.optim.sgd(ff.optim.cosine_decay_schedule(0.1, 50)),
    "sgd_constant_schedule": lambda: ff.optim.sgd(ff.optim.constant_schedule(0.1)),
    "momentum": lambda: ff.optim.sgd(0.05, momentum=0.9),
    "nesterov": lambda: ff.optim.sgd(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: ff.optim.adam(1e-2),
    "adam_schedule": lambda: ff.optim.adam(ff.optim.warmup_cosine_decay_schedule(0, 1e-2, 5, 50)),
    "adamw_masked": lambda: ff.optim.adamw(
        1e-2, weight_decay=0.1, mask=lambda p: ff.tree.map(lambda a: a.ndim > 1, p)),
}


def problem(xp=np):
    rng = np.random.default_rng(0)
    # "s": a 0-d leaf (a learned gain), whose NumPy arithmetic yields scalars, not arrays
    params = {"a": {"w": rng.standard_normal((7, 5)), "b": rng.standard_normal(7)},
              "c": [rng.standard_normal((3, 4, 2))], "s": rng.standard_normal(())}
    params = ff.tree.map(lambda a: xp.asarray(a.astype(np.float32)), params)
    target = ff.tree.map(lambda a: a * 0 + 1, params)
    return params, target


def quadratic_grads(p, t):
    return 2 * (p - t) + 0.01 * p * p


def run(opt, params, target, fused, steps=50, grad=quadratic_grads, overflow_at=()):
    """``steps`` updates of ``params`` towards ``target``; at the steps in ``overflow_at``
    every gradient is made non-finite (inf or nan)."""
    state = opt.init(params)
    for step in range(steps):
        grads = ff.tree.map(grad, params, target)
        if step in overflow_at:
            grads = ff.tree.map(lambda g: g * float("inf"), grads)
        if fused:
            params, state = ff.optim.update_and_apply(opt, grads, state, params)
        else:
            updates, state = opt.update(grads, state, params)
            params = ff.optim.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_and_apply_equals_update_then_apply_on_numpy(name):
    params, target = problem()
    a = run(OPTIMIZERS[name](), params, target, fused=True)
    b = run(OPTIMIZERS[name](), params, target, fused=False)
    assert ff.tree.structure(a) == ff.tree.structure(b)
    start = (params, OPTIMIZERS[name]().init(params))
    for x, y, x0 in zip(ff.tree.leaves(a), ff.tree.leaves(b), ff.tree.leaves(start)):
        # params and state stay arrays of their shapes on both paths, 0-d leaves included
        assert type(x) is type(y) is np.ndarray and x.shape == y.shape == x0.shape
        np.testing.assert_array_equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_gpu_kernel_matches_reference(name):
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    params, target = problem(cupy)
    be = ff.backend.get("cuda")
    be.reset_stats()
    fused_p, fused_s = run(OPTIMIZERS[name](), params, target, fused=True)
    kind = "adam" if "adam" in name else ("momentum" if name in ("momentum", "nesterov") else "sgd")
    assert be.calls["multi_tensor_update/" + kind] == 50  # one launch per step
    ref_p, ref_s = run(OPTIMIZERS[name](), params, target, fused=False)
    assert ff.tree.structure(fused_s) == ff.tree.structure(ref_s)
    for x, y in zip(ff.tree.leaves((fused_p, fused_s)), ff.tree.leaves((ref_p, ref_s))):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
def test_fused_dynamic_loss_scaling_matches_reference_through_an_overflow():
    """The skip flag: a step with an inf gradient leaves params, moments and counts alone."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow import mixed_precision as mp

    def run_mp(fused):
        params, target = problem(cupy)
        opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-2), init_scale=8.0, growth_interval=4)
        return run(opt, params, target, fused, steps=20, grad=lambda p, t: 2 * (p - t),
                   overflow_at=(3, 11))  # the overflowing steps must be skipped

    a, b = run_mp(True), run_mp(False)
    assert int(a[1].inner[0].count) == 18 and float(a[1].scale) == float(b[1].scale)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("lr", ["constant", "tabulated", "step_by_step"])
@pytest.mark.parametrize("opt_name", ["adam", "momentum", "sgd"])
def test_fused_path_keeps_the_counts_of_a_skipped_step(monkeypatch, opt_name, lr):
    """The state bookkeeping of the GPU's fused path under loss scaling, on the CPU: the
    arrays count as device arrays and the kernel's part is played by a stand-in that
    stores the counts as the update kernel does (old ones where the flag is False). The
    counts the kernel writes and those advanced outside it (a schedule without a table)
    both stay put on a skipped step and advance on a finite one; a constant step size has
    no count (its state is empty). The GPU test below runs the real kernel."""
    import fuseflow.optim._fused as fused_module
    from fuseflow.optim._schedules import horizon_of

    monkeypatch.setattr(fused_module, "is_cupy", lambda a: isinstance(a, np.ndarray))
    launches = []

    def kernel(kind, params, grads, groups, *, finite, count=None, new_count=None,
               sched_count=None, new_sched_count=None, **hyper):
        ok = bool(finite() if callable(finite) else finite)
        launches.append(ok)
        if new_count is not None:
            new_count[...] = count + 1 if ok else count
        if new_sched_count is not None:
            new_sched_count[...] = sched_count + 1 if ok else sched_count
        return params, groups

    monkeypatch.setattr(fused_module.backend, "multi_tensor_update", kernel)
    monkeypatch.setattr(fused_module, "lr_table", lambda lr, leaf: (  # no device to key on
        None if horizon_of(lr) is None else -lr(np.arange(horizon_of(lr) + 1, dtype=np.int32))))
    rate = {"constant": 1e-2, "tabulated": ff.optim.cosine_decay_schedule(1e-2, 12),
            "step_by_step": ff.optim.step_decay_schedule(1e-2, 5, 0.5)}[lr]
    opt = {"adam": lambda: ff.optim.adam(rate), "sgd": lambda: ff.optim.sgd(rate),
           "momentum": lambda: ff.optim.sgd(rate, momentum=0.9)}[opt_name]()
    params, _ = problem()
    state = opt.init(params)
    want = 0
    for ok in (True, False, True, True, False):
        out = fused_module.fused_update(opt, params, state, params,
                                        finite=lambda ok=ok: np.asarray(ok))
        assert out is not None
        state = out[1]
        want += ok
        counts = [int(c) for c in ff.tree.leaves(state) if c.ndim == 0 and c.dtype.kind == "i"]
        assert counts == [want] * ((opt_name == "adam") + (lr != "constant"))
    assert launches == [True, False, True, True, False]


@pytest.mark.gpu
@pytest.mark.parametrize("lr", ["constant", "tabulated", "step_by_step"])
@pytest.mark.parametrize("opt_name", ["adam", "momentum"])
def test_skipped_steps_keep_every_count_in_the_fused_step(opt_name, lr):
    """Under dynamic loss scaling the fused step keeps the whole inner state on a skipped
    step, counts included: the kernel stores the old Adam count and the old tabulated
    schedule count itself; a schedule without a table (``step_decay_schedule``) advances
    its count outside the kernel, selected there. Params, moments, counts and the scale
    equal the reference's (update, then apply_updates); one update launch a step."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow import mixed_precision as mp

    rate = {"constant": 1e-2, "tabulated": ff.optim.cosine_decay_schedule(1e-2, 12),
            "step_by_step": ff.optim.step_decay_schedule(1e-2, 5, 0.5)}[lr]
    make = {"adam": lambda: ff.optim.adam(rate),
            "momentum": lambda: ff.optim.sgd(rate, momentum=0.9)}[opt_name]
    runs = {}
    for fused in (True, False):
        params, target = problem(cupy)
        opt = mp.dynamic_loss_scaling(make(), init_scale=8.0, growth_interval=4)
        be = ff.backend.get("cuda")
        be.reset_stats()
        runs[fused] = run(opt, params, target, fused, steps=16,
                          grad=lambda p, t: 2 * (p - t), overflow_at=(0, 3, 4, 11))
        if fused:
            assert sum(v for k, v in be.calls.items()
                       if k.startswith("multi_tensor_update/")) == 16
    a, b = runs[True], runs[False]
    assert ff.tree.structure(a) == ff.tree.structure(b)
    counts = [int(c) for c in ff.tree.leaves(a[1].inner) if c.ndim == 0 and c.dtype.kind == "i"]
    # Adam's count and a schedule's: 16 steps, 4 skipped
    assert counts == [12] * ((opt_name == "adam") + (lr != "constant"))
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


SHORT_SCHEDULES = {  # horizons inside a 20-step run
    "cosine": lambda: ff.optim.cosine_decay_schedule(0.1, 8, alpha=0.1),
    "warmup_cosine": lambda: ff.optim.warmup_cosine_decay_schedule(0.0, 0.1, 3, 9, 0.01),
    "linear": lambda: ff.optim.linear_schedule(0.1, 0.01, 6, transition_begin=2),
}


@pytest.mark.parametrize("name", sorted(SHORT_SCHEDULES))
def test_schedule_horizon_is_where_it_goes_flat(name):
    """The fused GPU optimizers read a schedule from a table up to its horizon and hold
    the last value after it: every later count must give that value. A wrapper made with
    functools.wraps (which copies attributes) has no horizon."""
    import functools

    from fuseflow.optim._schedules import horizon_of

    lr = SHORT_SCHEDULES[name]()
    h = horizon_of(lr)
    counts = np.arange(h, h + 200, dtype=np.int32)
    np.testing.assert_array_equal(lr(counts), np.full(counts.shape, lr(np.int32(h))))
    assert lr(np.int32(h - 1)) != lr(np.int32(h))
    restart = functools.wraps(lr)(lambda count: lr(count % 5))
    assert horizon_of(restart) is None and horizon_of(lambda c: 0.1) is None
    assert horizon_of(ff.optim.step_decay_schedule(0.1, 5, 0.5)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SHORT_SCHEDULES))
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_tabulated_schedules_match_the_reference_past_their_horizon(opt_name, name):
    """On the GPU a schedule's step sizes come from a device table inside the update kernel,
    which also advances the step counts: 20 steps (past the horizon) give the reference's
    params, moments and counts; the table holds exactly the step-by-step values."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow.optim._fused import _LR_TABLES, lr_table
    from fuseflow.optim._schedules import horizon_of

    lr = SHORT_SCHEDULES[name]()
    params, target = problem(cupy)
    a = run(getattr(ff.optim, opt_name)(lr), params, target, fused=True, steps=20)
    assert lr in _LR_TABLES  # the fused steps built and used the table
    b = run(getattr(ff.optim, opt_name)(lr), params, target, fused=False, steps=20)
    table = lr_table(lr, params["a"]["w"])
    assert table.dtype == np.float32 and table.size == horizon_of(lr) + 1
    for c in range(horizon_of(lr) + 1):
        assert float(table[c]) == float(cupy.asarray(-1.0 * lr(cupy.asarray(c, cupy.int32)))
                                        .astype(cupy.float32))
    counts = [int(x) for x in ff.tree.leaves(a[1]) if x.dtype == np.int32]
    assert counts and counts == [int(x) for x in ff.tree.leaves(b[1]) if x.dtype == np.int32]
    assert all(c == 20 for c in counts)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_host_step_counts_with_gpu_params_take_the_old_path(opt_name):
    """Optimizer state made on the host (its counts NumPy) and params moved to the GPU: the
    kernel cannot write host counts, so the schedule and counts run as CuPy/NumPy ops and
    the results still match the reference."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    lr = SHORT_SCHEDULES["cosine"]()
    host_params, target = problem()
    opt = getattr(ff.optim, opt_name)(lr)
    params = ff.device_put(host_params, "cuda")
    target = ff.device_put(target, "cuda")
    state = ff.tree.map(lambda a: cupy.asnumpy(a) if a.dtype == np.int32 else a,
                        opt.init(params))  # the counts on the host, the rest on the GPU
    for _ in range(12):
        grads = ff.tree.map(quadratic_grads, params, target)
        params, state = ff.optim.update_and_apply(opt, grads, state, params)
    ref_p, ref_s = run(opt, ff.device_put(host_params, "cuda"), target, fused=False, steps=12)
    assert [int(c) for c in ff.tree.leaves(state) if c.dtype == np.int32] == \
        [int(c) for c in ff.tree.leaves(ref_s) if c.dtype == np.int32]
    for x, y in zip(ff.tree.leaves(params), ff.tree.leaves(ref_p)):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_host_step_counts_with_gpu_params_under_loss_scaling(fused):
    """The same under dynamic loss scaling, through overflows: a skipped step keeps the
    host counts too (selected on the flag's device, where they then live), fused or not."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow import mixed_precision as mp

    host_params, target = problem()
    opt = mp.dynamic_loss_scaling(ff.optim.adam(SHORT_SCHEDULES["cosine"]()), init_scale=8.0)
    params = ff.device_put(host_params, "cuda")
    target = ff.device_put(target, "cuda")
    host_counts = opt.init  # the counts on the host, the rest on the GPU

    def init(params):
        state = host_counts(params)
        return state._replace(inner=ff.tree.map(
            lambda a: cupy.asnumpy(a) if a.dtype == np.int32 else a, state.inner))

    opt_host = ff.optim.GradientTransformation(init, opt.update)
    kw = dict(steps=12, grad=lambda p, t: 2 * (p - t), overflow_at=(2, 7))
    p, s = run(opt_host, params, target, fused, **kw)
    ref_p, ref_s = run(opt, params, target, False, **kw)  # device counts, the reference
    counts = [int(c) for c in ff.tree.leaves(s.inner) if c.dtype == np.int32]
    assert counts == [int(c) for c in ff.tree.leaves(ref_s.inner) if c.dtype == np.int32]
    assert counts == [10, 10]  # Adam's and the schedule's: 12 steps, 2 skipped
    for x, y in zip(ff.tree.leaves(p), ff.tree.leaves(ref_p)):
        np.testing.assert_allclose(cupy.asnumpy(x), cupy.asnumpy(y), rtol=2e-5, atol=1e-6)


def test_donated_grads_give_the_same_params():
    params, target = problem()
    opt = ff.optim.sgd(0.1)
    grads = ff.tree.map(lambda p, t: 2 * (p - t), params, target)
    kept = ff.tree.map(np.copy, grads)
    a, _ = ff.optim.update_and_apply(opt, kept, opt.init(params), params)
    b, _ = ff.optim.update_and_apply(opt, grads, opt.init(params), params, donate_grads=True)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("donate", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_host_update_in_blocks_equals_the_reference(name, donate, monkeypatch):
    """The host update works through leaves in blocks (here of 16 elements, so that leaves
    span several, the last one partial) and writes the new params into donated gradients:
    bit for bit the reference, with layouts whose flat view is a copy (a transposed and a
    Fortran-order leaf), one gradient array given for two leaves, and a 0-d leaf."""
    from fuseflow.optim import _fused

    monkeypatch.setattr(_fused, "HOST_BLOCK", 16)
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((9, 7)).astype(np.float32),
              "t": rng.standard_normal((5, 11)).astype(np.float32).T,
              "f": np.asfortranarray(rng.standard_normal((6, 4)).astype(np.float32)),
              "v": rng.standard_normal(33).astype(np.float32),
              "u": rng.standard_normal(33).astype(np.float32),
              "s": np.asarray(rng.standard_normal(), np.float32),
              "x": rng.standard_normal((7, 9)).astype(np.float32)}
    opt = OPTIMIZERS[name]()
    state = ref_state = opt.init(params)
    p = ref_p = params
    for _ in range(4):
        grads = ff.tree.map(lambda a: (a * 0.5 + rng.standard_normal(a.shape)).astype(a.dtype),
                            p)
        grads["u"] = grads["v"]  # one array for two leaves: donated to neither
        grads["x"] = grads["w"].T  # tied weights: a gradient and its transpose
        grads["t"] = np.ascontiguousarray(grads["t"].T).T  # not C-contiguous
        given = ff.tree.map(np.copy, grads)
        updates, ref_state = opt.update(ff.tree.map(np.copy, grads), ref_state, ref_p)
        ref_p = ff.optim.apply_updates(ref_p, updates)
        p, state = ff.optim.update_and_apply(opt, grads, state, p, donate_grads=donate)
        for x, y in zip(ff.tree.leaves((p, state)), ff.tree.leaves((ref_p, ref_state))):
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        if not donate:  # the gradients are left as given
            for x, y in zip(ff.tree.leaves(grads), ff.tree.leaves(given)):
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_host_update_never_writes_into_params_given_as_gradients(name):
    params, _ = problem()
    opt = OPTIMIZERS[name]()
    kept = ff.tree.map(np.copy, params)
    updates, ref_state = opt.update(kept, opt.init(kept), kept)
    ref = ff.optim.apply_updates(kept, updates)
    p, _ = ff.optim.update_and_apply(opt, params, opt.init(params), params, donate_grads=True)
    for x, y, before, now in zip(*map(ff.tree.leaves, (p, ref, kept, params))):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(now, before)  # the params given are unchanged


def test_host_update_with_state_in_another_dtype_takes_the_reference_path():
    params = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    opt = ff.optim.adam(1e-2)
    state = opt.init(params)
    state = (state[0]._replace(mu=ff.tree.map(lambda a: a.astype(np.float64), state[0].mu)),
             *state[1:])
    grads = ff.tree.map(lambda a: a * 3 - 1, params)
    updates, ref_state = opt.update(grads, state, params)
    p, s = ff.optim.update_and_apply(opt, grads, state, params)
    np.testing.assert_array_equal(p["w"], ff.optim.apply_updates(params, updates)["w"])
    assert s[0].mu["w"].dtype == ref_state[0].mu["w"].dtype


def test_loss_scaled_update_skips_overflowing_steps_on_numpy():
    from fuseflow import mixed_precision as mp

    params, target = problem()
    opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-2), init_scale=8.0, growth_interval=4)
    with np.errstate(invalid="ignore", over="ignore"):
        p, s = run(opt, params, target, fused=True, steps=20, overflow_at=(3, 11))
    assert int(s.inner[0].count) == 18 and all(np.isfinite(x).all() for x in ff.tree.leaves(p))


@pytest.mark.gpu
@pytest.mark.parametrize("vector_bytes", [8, 16])
@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64])
def test_multi_tensor_cast_and_all_finite_match_per_leaf_ops(src, vector_bytes, monkeypatch):
    """Mixed precision's one-launch helpers: the casts (scaled ones in float32, bit for bit
    like ``g.astype(float32) * inv``) and the finiteness flag with an inf or nan anywhere:
    in a full vector, in a tensor's partial last vector, in a misaligned tensor (scalar
    path); with 4 elements per thread (vector_bytes=8) and 16 bytes per access."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow.backend import _cuda_fused

    monkeypatch.setattr(_cuda_fused, "VECTOR_BYTES", vector_bytes)
    rng = np.random.default_rng()
    leaves = [cupy.asarray((rng.standard_normal(s) * 100).astype(src))
              for s in [(7, 5), (7,), (3, 4, 2), (1000, 33), (64,)]]
    misaligned = [cupy.asarray((rng.standard_normal(4099) * 100).astype(src))[1:]]
    for group in (leaves, misaligned, leaves + misaligned):
        for dst in (np.float16, np.float32):
            got = ff.backend.multi_tensor_cast(group, dst)
            for g, a in zip(got, group):
                assert g.dtype == dst and g.shape == a.shape
                np.testing.assert_array_equal(cupy.asnumpy(g), cupy.asnumpy(a).astype(dst))
        inv = cupy.asarray(1 / 1024, dtype=cupy.float32)
        for g, a in zip(ff.backend.multi_tensor_cast(group, np.float32, inv), group):
            np.testing.assert_array_equal(cupy.asnumpy(g),
                                          cupy.asnumpy(a.astype(np.float32) * inv))
        assert bool(ff.backend.all_finite(group))
        for bad in (np.inf, -np.inf, np.nan):
            for k in range(len(group)):
                flat = group[k].reshape(-1)  # a view: the misaligned one stays misaligned
                for at in (0, flat.size - 1, int(rng.integers(flat.size))):
                    kept = flat[at].copy()
                    flat[at] = bad
                    assert not bool(ff.backend.all_finite(group)), (bad, k, at)
                    flat[at] = kept


def scaled_run(xp, opt, steps=20, overflow_at=(3, 11), scaled=True):
    """Mixed precision's update from float16 grads still multiplied by the loss scale:
    ``update_and_apply_scaled`` (scaled=True), ``unscale`` then ``update_and_apply``
    (False), or ``unscale`` then ``opt.update`` and ``apply_updates`` ("reference")."""
    from fuseflow import mixed_precision as mp

    params, _ = problem(xp)
    state = opt.init(params)
    for step in range(steps):
        # the same gradients on every path (a fresh draw per step, not from the params: a
        # float16 rounding would amplify the paths' last-bit differences)
        rng = np.random.default_rng(step)
        base = ff.tree.map(lambda p, r=rng: xp.asarray(r.standard_normal(p.shape)
                                                       .astype(np.float32)), params)
        grads = ff.tree.map(lambda g, s=state.scale: (g * s).astype(xp.float16), base)
        if step in overflow_at:
            grads = ff.tree.map(lambda g: g * xp.float16("inf"), grads)
        if scaled == "reference":
            updates, state = opt.update(mp.unscale(grads, params, state.scale), state, params)
            params = ff.optim.apply_updates(params, updates)
        elif scaled:
            params, state = mp.update_and_apply_scaled(opt, grads, state, params)
        else:
            params, state = ff.optim.update_and_apply(
                opt, mp.unscale(grads, params, state.scale), state, params)
    return params, state


@pytest.mark.parametrize("copy", [None, "float16"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_host_loss_scaled_update_is_the_reference_bit_for_bit(name, copy, monkeypatch):
    """On NumPy the named optimizers under dynamic_loss_scaling take the fused host update
    (the flag read on the host, a skipped step keeping everything, the unscaled gradients
    donated as the new params' buffers): params, moments, counts, loss scale and compute
    copy are those of ``opt.update`` + ``apply_updates``, bit for bit, through two
    overflows, from scaled and from unscaled float16 gradients."""
    from fuseflow import mixed_precision as mp
    from fuseflow.optim import _fused

    taken = []
    host_update = _fused._host_update
    monkeypatch.setattr(_fused, "_host_update",
                        lambda *a, **k: taken.append(1) or host_update(*a, **k))

    def opt():
        return mp.dynamic_loss_scaling(OPTIMIZERS[name](), init_scale=64.0, growth_interval=4,
                                       compute_dtype=copy)

    with np.errstate(invalid="ignore", over="ignore"):
        ref = scaled_run(np, opt(), scaled="reference")
        assert not taken
        for scaled in (True, False):
            got = scaled_run(np, opt(), scaled=scaled)
            assert len(taken) == 18  # every step but the two skipped ones
            taken.clear()
            assert ff.tree.structure(got) == ff.tree.structure(ref)
            for x, y in zip(ff.tree.leaves(got), ff.tree.leaves(ref)):
                assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_scaled_update_equals_unscale_then_update(name):
    """update_and_apply_scaled's contract on NumPy, where it runs unscale + update_and_apply
    itself: the loss scale's schedule through two overflows, the skipped steps not counted,
    and the error without a loss-scaling state. (The GPU kernels that fold the unscaling in
    are compared bit for bit below.)"""
    from fuseflow import mixed_precision as mp

    def opt():
        return mp.dynamic_loss_scaling(OPTIMIZERS[name](), init_scale=64.0, growth_interval=4)

    with np.errstate(invalid="ignore", over="ignore"):
        a = scaled_run(np, opt())
        b = scaled_run(np, opt(), scaled=False)
    # 64, halved at the two overflows (steps 3 and 11), doubled after every 4 good steps
    assert float(a[1].scale) == float(b[1].scale) == 128.0 and int(a[1].good_steps) == 0
    if "adam" in name:
        assert int(a[1].inner[0].count) == 18  # the two skipped steps are not counted
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(TypeError, match="dynamic_loss_scaling"):
        mp.update_and_apply_scaled(ff.optim.sgd(0.1), a[0], ff.optim.sgd(0.1).init(a[0]), a[0])


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_scaled_gpu_update_matches_the_unscaled_kernels_bit_for_bit(name):
    """On the GPU the unscaling runs inside the finiteness check and the update kernel
    (the 16-bit grads are read, never written in float32): the same float32 products as
    ``unscale`` + ``update_and_apply``, so the same bits; and near the NumPy reference."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow import mixed_precision as mp

    def opt():
        return mp.dynamic_loss_scaling(OPTIMIZERS[name](), init_scale=64.0, growth_interval=4)

    kind = "adam" if "adam" in name else ("momentum" if name in ("momentum", "nesterov") else "sgd")
    be = ff.backend.get("cuda")
    be.reset_stats()
    a = scaled_run(cupy, opt())
    assert be.calls[f"multi_tensor_update/{kind}/scaled"] == 20
    assert be.calls["multi_tensor_cast"] == 0  # no float32 copy of the grads
    b = scaled_run(cupy, opt(), scaled=False)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = scaled_run(np, opt())
    assert float(a[1].scale) == float(b[1].scale) == float(ref[1].scale)
    for x, y, r in zip(ff.tree.leaves(a), ff.tree.leaves(b), ff.tree.leaves(ref)):
        np.testing.assert_array_equal(cupy.asnumpy(x), cupy.asnumpy(y))
        np.testing.assert_allclose(cupy.asnumpy(x), r, rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
def test_scaled_all_finite_checks_the_unscaled_product():
    """all_finite(leaves, scale): float16 values that are finite but overflow float32 once
    multiplied by the scale count as non-finite, as in the unscaled float32 grads."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    rng = np.random.default_rng()
    host = [(rng.standard_normal(s) * 1000).astype(np.float16) for s in [(7, 5), (1000, 33)]]
    leaves = [cupy.asarray(a) for a in host]
    for value in (1 / 1024, 1.0, 1e30, 1e35):  # 1e35: 1000 * 1e35 overflows float32
        scale = np.float32(value)
        with np.errstate(over="ignore"):
            want = all(np.isfinite(a.astype(np.float32) * scale).all() for a in host)
            assert bool(ff.backend.all_finite(host, scale=np.asarray(scale))) == want
        assert bool(ff.backend.all_finite(leaves, scale=cupy.asarray(scale))) == want, value


def test_all_finite_forms_the_inverse_scale_on_numpy():
    """``inverse_into``: the check's factor is ``1 / scale``, stored there (on NumPy by the
    reference operations); it needs a scale and a 0-d float32 array."""
    leaves = [np.array([1.0, -2.0], np.float16), np.array([[3e4]], np.float16)]
    inv = np.empty((), np.float32)
    for value, want in ((3.0, True), (1e-36, False)):  # 3e4 * 1e36 overflows float32
        with np.errstate(over="ignore"):
            assert bool(ff.backend.all_finite(leaves, scale=np.float32(value),
                                              inverse_into=inv)) == want
        assert inv == np.float32(1) / np.float32(value)
    with pytest.raises(ValueError, match="inverse_into needs a scale and a 0-d float32"):
        ff.backend.all_finite(leaves, inverse_into=inv)
    with pytest.raises(ValueError, match="inverse_into needs a scale and a 0-d float32"):
        ff.backend.all_finite(leaves, scale=np.float32(2), inverse_into=np.empty(1, np.float32))


@pytest.mark.gpu
def test_all_finite_kernel_stores_the_inverse_scale_bit_for_bit():
    """On the GPU the finiteness kernel divides 1 by the scale itself and stores it for the
    update kernel (mixed precision's unscaling factor, formerly a launch of its own): the
    bits of CuPy's ``1 / scale``, and the check made with it; leaves without elements still
    get it stored."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    rng = np.random.default_rng(4)
    leaves = [cupy.asarray((rng.standard_normal(s) * 1000).astype(np.float16))
              for s in [(7, 5), (1000, 33)]]
    # 2**127: its inverse is subnormal, flushed to 0 by both GPU paths
    for value in (1.0, 3.0, 1 / 3, 2.0 ** 15, 1e-3, 6.1e30, 7e-36, 2.0 ** 127):
        scale = cupy.asarray(np.float32(value))
        want_inv = 1.0 / scale
        inv = cupy.full((), np.nan, dtype=cupy.float32)
        ok = ff.backend.all_finite(leaves, scale=scale, inverse_into=inv)
        assert cupy.asnumpy(inv).view(np.uint32) == cupy.asnumpy(want_inv).view(np.uint32)
        assert bool(ok) == bool(ff.backend.all_finite(leaves, scale=want_inv)), value
    inv = cupy.full((), np.nan, dtype=cupy.float32)
    assert bool(ff.backend.all_finite([cupy.zeros((0, 3), cupy.float16)],
                                      scale=cupy.asarray(np.float32(3)), inverse_into=inv))
    assert float(inv) == float(np.float32(1) / np.float32(3))


@pytest.mark.gpu
def test_loss_scale_kernel_matches_the_numpy_rule():
    """The one-launch loss-scale update (GPU) gives exactly the NumPy rule's scale and count:
    growth after ``growth_interval`` finite steps, backoff on inf/nan, the ``min_scale``
    floor, and float32 overflow of the scale itself."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    from fuseflow import mixed_precision as mp

    opt = mp.dynamic_loss_scaling(ff.optim.sgd(0.1), growth_interval=3, min_scale=1.5)
    be = ff.backend.get("cuda")
    for scale in (1.0, 2.5, 2.0 ** 15, 3e38):
        for good in (0, 1, 2):
            for finite in (True, False):
                grads = [np.array([1.0, 2.0 if finite else np.inf], np.float32)]
                params = [np.zeros(2, np.float32)]
                state = mp.DynamicScaleState(np.asarray(scale, np.float32),
                                             np.asarray(good, np.int32), opt.init(params).inner)
                with np.errstate(invalid="ignore", over="ignore"):  # inf grads, 3e38 * 2
                    _, ref = opt.update(grads, state, params)
                calls = be.calls["next_loss_scale"]
                _, got = opt.update(*ff.device_put((grads, state, params), "cuda"))
                assert be.calls["next_loss_scale"] == calls + 1
                case = (scale, good, finite)
                assert cupy.asnumpy(got.scale).tobytes() == np.asarray(ref.scale).tobytes(), case
                assert int(got.good_steps) == int(ref.good_steps), case


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("where", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compute_copy_is_the_cast_params_after_every_update(name, where):
    """dynamic_loss_scaling(compute_dtype="float16") keeps compute_params equal to
    params.astype(float16), bit for bit, through two overflows (skipped steps): on NumPy
    the wrapper's update casts the applied params, on the GPU the update kernel writes the
    copy itself (no cast launch after init). Params and state match the run without it."""
    from fuseflow import mixed_precision as mp

    if where == "cuda" and not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    xp = np
    if where == "cuda":
        import cupy as xp

        be = ff.backend.get("cuda")
        be.reset_stats()

    def opt(copy):
        return mp.dynamic_loss_scaling(OPTIMIZERS[name](), init_scale=64.0, growth_interval=4,
                                       compute_dtype="float16" if copy else None)

    def host(a):
        return a.get() if hasattr(a, "get") else np.asarray(a)

    with np.errstate(invalid="ignore", over="ignore"):
        for scaled in (True, False):
            a = scaled_run(xp, opt(True), scaled=scaled)
            if where == "cuda" and scaled:  # the init's cast only: the kernel writes the copy
                assert be.calls["multi_tensor_cast"] == 1
            b = scaled_run(xp, opt(False), scaled=scaled)
            assert b[1].compute_params is None
            for p, low in zip(ff.tree.leaves(a[0]), ff.tree.leaves(a[1].compute_params)):
                assert low.dtype == np.float16 and low.shape == p.shape
                np.testing.assert_array_equal(host(low), host(p).astype(np.float16))
            state_a = a[1]._replace(compute_params=None)
            for x, y in zip(ff.tree.leaves((a[0], state_a)), ff.tree.leaves((b[0], b[1]))):
                np.testing.assert_array_equal(host(x), host(y))
    # opt.update + apply_updates (float32 grads) keeps it current too; it needs the params
    params, target = problem(xp)
    o = opt(True)
    p, s = run(o, params, target, fused=False, steps=7, overflow_at=(2,))
    for x, low in zip(ff.tree.leaves(p), ff.tree.leaves(s.compute_params)):
        np.testing.assert_array_equal(host(low), host(x).astype(np.float16))
    grads = ff.tree.map(quadratic_grads, params, target)
    with pytest.raises(TypeError, match="needs the params"):
        o.update(grads, o.init(params))


@pytest.mark.parametrize("name", ["sgd_schedule", "adam_schedule", "momentum_schedule"])
def test_scheduled_update_of_mixed_precision_leaves_equals_the_reference(name):
    """A float32 and a float64 leaf under one schedule: the reference rounds the step size
    per leaf dtype, so the fused step (one step size per launch) must not take them."""
    make = {"sgd_schedule": OPTIMIZERS["sgd_schedule"],
            "adam_schedule": OPTIMIZERS["adam_schedule"],
            "momentum_schedule": lambda: ff.optim.sgd(ff.optim.linear_schedule(0.1, 0.0, 7),
                                                      momentum=0.9)}[name]
    params, target = problem()
    params["a"]["w"] = params["a"]["w"].astype(np.float64)  # the first leaf, a/b, is float32
    assert ff.tree.leaves(params)[0].dtype == np.float32
    target = ff.tree.map(lambda a: a * 0 + 1, params)
    a = run(make(), params, target, fused=True, steps=5)
    b = run(make(), params, target, fused=False, steps=5)
    for x, y in zip(ff.tree.leaves(a), ff.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
