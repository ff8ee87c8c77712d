"""What an audit of the Python API found, each case fixed and kept: numbers that came out
wrong without an error, a call that never returned, and errors that did not say where."""

from __future__ import annotations

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import optim


def test_fused_sgd_adds_a_narrower_update_in_the_params_precision(rng):
    p = {"w": 1 + rng.standard_normal(5) * 1e-9}  # float64 params, float32 grads
    g = {"w": rng.standard_normal(5).astype(np.float32) * 1e-3}
    opt = optim.sgd(0.1)
    u, _ = opt.update(g, opt.init(p), p)
    reference = optim.apply_updates(p, u)["w"]
    fused, _ = optim.update_and_apply(opt, g, opt.init(p), p)
    assert fused["w"].dtype == np.float64
    np.testing.assert_array_equal(fused["w"], reference)  # bit for bit, as documented
    zero, _ = optim.update_and_apply(opt, {"w": np.zeros(5, np.float32)}, opt.init(p), p)
    np.testing.assert_array_equal(zero["w"], p["w"])  # a zero step leaves the params alone


def test_allreduce_mean_keeps_each_leafs_dtype(rng):
    g = {"w": rng.standard_normal((2, 2)).astype(np.float32), "x": rng.standard_normal(2),
         "h": rng.standard_normal(2).astype(np.float16)}
    out = ff.distributed.Communicator(None, always_reduce=True).allreduce_mean(g)
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in g.items()}
    for k in g:
        np.testing.assert_array_equal(out[k], g[k])  # one rank: the mean is the value
    assert ff.distributed.Communicator(None, always_reduce=True).allreduce_mean({}) == {}


def test_shard_refuses_arrays_of_different_lengths(rng):
    comm = ff.distributed.init()
    with pytest.raises(ff.distributed.DistributedError, match=r"\[8, 7\] examples.*Fix:"):
        comm.shard(rng.standard_normal((8, 3)), rng.integers(0, 3, 7))
    with pytest.raises(ff.distributed.DistributedError, match="no arrays"):
        comm.shard()


def test_vdot_refuses_trees_of_another_structure():
    a = {"a": np.ones(2), "b": np.full(3, 2.0)}
    assert float(ff.tree.vdot(a, a)) == 2 + 12
    with pytest.raises(ValueError, match="tree.vdot: the two trees do not match"):
        ff.tree.vdot(a, {"a": np.ones(2)})


@pytest.mark.parametrize("lower, upper", [(2.0, -2.0), (1.0, 1.0), (8.0, 9.0)])
def test_truncated_normal_refuses_an_interval_it_cannot_sample(lower, upper):
    with pytest.raises(ValueError, match=r"truncated_normal: .* holds .*Fix:"):
        ff.random.truncated_normal(ff.random.key(0), (3,), lower, upper)


def test_truncated_normal_still_samples_a_narrow_interval_near_zero():
    x = ff.random.truncated_normal(ff.random.key(0), (1000,), 0.5, 0.6)
    assert x.min() >= 0.5 and x.max() <= 0.6


def test_random_errors_name_the_function_and_fold_in_refuses_what_it_would_wrap():
    k = ff.random.key(0)
    with pytest.raises(TypeError, match=r"ff.random.split: expected a key"):
        ff.random.split(np.zeros(3))
    with pytest.raises(ValueError, match=r"ff.random.split: num must be an int >= 0"):
        ff.random.split(k, -1)
    with pytest.raises(TypeError, match=r"ff.random.fold_in: data must be an int"):
        ff.random.fold_in(k, 1.7)
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        ff.random.fold_in(k, 2 ** 64 + 3)
    np.testing.assert_array_equal(ff.random.fold_in(k, -1), ff.random.fold_in(k, 2 ** 64 - 1))


def test_tree_helpers_take_python_numbers_as_leaves():
    t = {"a": 3.0, "b": np.full(1, 4.0)}
    assert ff.tree.size(t) == 2 and float(ff.tree.l2_norm(t)) == 5.0
    ff.distributed.init().check_model({"a": 3, "w": np.ones(2)})  # no AttributeError


def test_review_round_two(rng):
    """A second review's findings: 0-d integer arrays as JAX takes them, vdot's shapes,
    integer leaves' means, a min_scale that is 0 in float32, mse's hint for one output,
    array bounds of truncated_normal, NumPy integers in donate_argnums."""
    from fuseflow import mixed_precision as mp

    k = ff.random.key(0)
    np.testing.assert_array_equal(ff.random.fold_in(k, np.asarray(5)), ff.random.fold_in(k, 5))
    assert ff.random.split(k, np.asarray(3)).shape == (3, 2)
    with pytest.raises(TypeError, match="num must be an int"):
        ff.random.split(k, 2.0)
    for a, b in [({"w": np.ones(3)}, {"w": np.ones(1)}), ({"w": np.ones(3)}, {"w": {"k": 1}})]:
        with pytest.raises(ValueError, match="tree.vdot: the two trees do not match"):
            ff.tree.vdot(a, b)
    out = ff.distributed.Communicator(None, always_reduce=True).allreduce_mean(
        {"n": np.array([1, 2])})
    assert out["n"].dtype.kind == "f"
    with pytest.raises(ValueError, match="is 0 in float32"):
        mp.dynamic_loss_scaling(optim.sgd(0.1), init_scale=1.0, min_scale=1e-50)
    with pytest.raises(ff.losses.LossError, match=r"reshape\(-1, 1\)"):
        ff.losses.mse(rng.standard_normal((4, 1)).astype(np.float32), rng.integers(0, 3, 4))
    x = ff.random.truncated_normal(k, (2,), np.array([-1.0, 0.0]), np.array([0.0, 1.0]))
    assert x[0] <= 0 <= x[1]
    assert ff.compile(lambda p: p, donate_argnums=[np.int64(0)]) is not None


def test_mixed_precision_in_float64_on_float32_params_with_adam(rng):
    """compute_dtype='float64' (wider than the params) with a stateful optimizer: the
    scaled grads are unscaled to the params' dtype before the state sees them."""
    from fuseflow import mixed_precision as mp
    from fuseflow import train as T

    model = ff.nn.Serial(ff.nn.Dense(8, "relu"), ff.nn.Dense(3))
    opt = mp.dynamic_loss_scaling(optim.adam(1e-3))
    state = T.init_state(model, opt, (5,), ff.random.key(0))
    x, y = rng.standard_normal((16, 5)).astype(np.float32), rng.integers(0, 3, 16)
    step = T.make_step(model, ff.losses.softmax_cross_entropy, opt, compute_dtype="float64")
    params, opt_state, metrics = step(state.params, state.opt_state, x, y)
    assert np.isfinite(float(metrics["loss"]))
    assert {a.dtype for a in ff.tree.leaves(opt_state.inner[0].mu)} == {np.dtype(np.float32)}
