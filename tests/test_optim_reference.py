"""Optimizers, transforms and a schedule against their published formulas, written out here
in float64 (test_optim compares with optax, test_fused_optim the fused path with the
reference transforms): six steps of random gradients (``rng``) in float64 and float32,
through ``update`` + ``apply_updates`` and through ``update_and_apply``, with contiguous and
transposed gradients and with a 0-d parameter.
"""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import optim
from tests import reference as ref

LR, MOMENTUM, B1, B2, EPS, DECAY, STEPS, HORIZON = 0.1, 0.9, 0.9, 0.999, 1e-8, 0.01, 6, 4

OPTS = {
    "sgd": lambda: optim.sgd(LR),
    "momentum": lambda: optim.sgd(LR, momentum=MOMENTUM),
    "nesterov": lambda: optim.sgd(LR, momentum=MOMENTUM, nesterov=True),
    "adam": lambda: optim.adam(LR),
    "adamw": lambda: optim.adamw(LR, weight_decay=DECAY,
                                 mask=lambda p: ff.tree.map(lambda a: a.ndim > 1, p)),
    "clip_sgd": lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(LR)),
    "sgd_cosine": lambda: optim.sgd(optim.cosine_decay_schedule(LR, HORIZON)),
}


def reference_step(name, p, g, st, t):
    """One step of optimizer ``name`` from its formula, in float64; t counts from 1 and st
    (a dict, empty at first) carries the traces/moments. Returns (new params, st)."""
    g = {k: v.astype(np.float64) for k, v in g.items()}
    p = {k: v.astype(np.float64) for k, v in p.items()}
    lr = LR
    if name == "clip_sgd":
        norm = np.sqrt(sum((v**2).sum() for v in g.values()))
        g = {k: v / max(norm, 1.0) for k, v in g.items()}
    if name in ("momentum", "nesterov"):
        st = {k: g[k] + MOMENTUM * st.get(k, 0) for k in g}
        u = {k: g[k] + MOMENTUM * st[k] for k in g} if name == "nesterov" else st
    elif name in ("adam", "adamw"):
        m = {k: (1 - B1) * g[k] + B1 * st.get(("m", k), 0) for k in g}
        v = {k: (1 - B2) * g[k] ** 2 + B2 * st.get(("v", k), 0) for k in g}
        st = {**{("m", k): m[k] for k in g}, **{("v", k): v[k] for k in g}}
        u = {k: (m[k] / (1 - B1**t)) / (np.sqrt(v[k] / (1 - B2**t)) + EPS) for k in g}
        if name == "adamw":  # decoupled decay, masked to the matrices
            u = {k: u[k] + DECAY * p[k] * (p[k].ndim > 1) for k in g}
    else:  # sgd, clip_sgd, sgd_cosine
        u = g
        if name == "sgd_cosine":
            lr = LR * 0.5 * (1 + np.cos(np.pi * min(t - 1, HORIZON) / HORIZON))
    return {k: p[k] - lr * u[k] for k in p}, st


def problem(rng, dtype, zero_d=False, transposed=False):
    params = {"w": rng.standard_normal((3, 4)).astype(dtype),
              "b": rng.standard_normal(3).astype(dtype)}
    if zero_d:  # a learned temperature, a custom layer's gain
        params["s"] = np.asarray(rng.standard_normal(), dtype)
    grads = [{k: rng.standard_normal(v.shape).astype(dtype) for k, v in params.items()}
             for _ in range(STEPS)]
    if transposed:
        grads = [dict(g, w=rng.standard_normal((4, 3)).astype(dtype).T) for g in grads]
    return params, grads


def check_against_formula(rng, name, dtype, fused, **problem_options):
    params, grads = problem(rng, dtype, **problem_options)
    opt = OPTS[name]()
    got, state = params, opt.init(params)
    for g in grads:
        if fused:
            got, state = optim.update_and_apply(opt, g, state, got)
        else:
            u, state = opt.update(g, state, got)
            got = optim.apply_updates(got, u)
    want, st = params, {}
    for t, g in enumerate(grads, 1):
        want, st = reference_step(name, want, g, st, t)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    assert got.keys() == want.keys()
    for k in want:
        assert isinstance(got[k], np.ndarray), (k, type(got[k]))
        assert got[k].dtype == dtype and got[k].shape == params[k].shape, (k, got[k])
        ref.close(got[k], want[k], tol, tol, f"{name} {k}", rng.seed)


FUSED = pytest.mark.parametrize("fused", [False, True], ids=["update", "update_and_apply"])


@pytest.mark.parametrize("name", sorted(OPTS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@FUSED
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_optimizer_vs_handwritten_formula(rng, name, dtype, fused, transposed):
    check_against_formula(rng, name, dtype, fused, transposed=transposed)


@pytest.mark.parametrize("name", sorted(OPTS))
@FUSED
def test_optimizer_with_a_0d_parameter(rng, name, fused):
    """A 0-d parameter stays a 0-d array and follows the formula like any other leaf."""
    check_against_formula(rng, name, np.float32, fused, zero_d=True)


def test_building_blocks_vs_formula(rng):
    """scale, identity, trace, add_decayed_weights, scale_by_learning_rate (both signs, and
    a schedule), scale_by_schedule, chain, apply_updates: a step each from the formula."""
    p = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    g = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    cases = [
        (optim.scale(-0.3), lambda g, p: -0.3 * g),
        (optim.identity(), lambda g, p: g),
        (optim.trace(0.5), lambda g, p: g),  # first step: t = g
        (optim.trace(0.5, nesterov=True), lambda g, p: g + 0.5 * g),
        (optim.add_decayed_weights(0.2), lambda g, p: g + 0.2 * p),
        (optim.scale_by_learning_rate(0.1), lambda g, p: -0.1 * g),
        (optim.scale_by_learning_rate(0.1, flip_sign=False), lambda g, p: 0.1 * g),
        (optim.scale_by_learning_rate(lambda c: 0.1 / (1 + c)), lambda g, p: -0.1 * g),
        (optim.scale_by_schedule(lambda c: 2.0 + c), lambda g, p: 2.0 * g),
        (optim.chain(optim.add_decayed_weights(0.2), optim.scale(2.0)),
         lambda g, p: 2.0 * (g + 0.2 * p)),
    ]
    for i, (opt, f) in enumerate(cases):
        u, _ = opt.update(g, opt.init(p), p)
        for k in p:
            ref.close(u[k], f(g[k], p[k]), 1e-14, 1e-14, f"case {i} {k}", rng.seed)
    # the second step of a trace and of a schedule (the count has advanced)
    tr = optim.trace(0.5)
    _, st = tr.update(g, tr.init(p), p)
    u, _ = tr.update(g, st, p)
    ref.close(u["w"], g["w"] + 0.5 * g["w"], 1e-14, 1e-14, "trace, step 2", rng.seed)
    sc = optim.scale_by_schedule(lambda c: 2.0 + c)
    _, st = sc.update(g, sc.init(p), p)
    u, _ = sc.update(g, st, p)
    ref.close(u["b"], 3.0 * g["b"], 1e-14, 1e-14, "schedule, step 2", rng.seed)
    new = optim.apply_updates(p, g)
    np.testing.assert_array_equal(new["w"], p["w"] + g["w"])
