"""Losses against finite differences and definitions; random keys; pytree helpers."""

import numpy as np
import pytest

import fuseflow as ff
from tests import reference as ref


@pytest.mark.parametrize("batch,classes", [(1, 1), (1, 3), (7, 10), (5, 37)])
def test_softmax_cross_entropy(batch, classes):
    rng = np.random.default_rng(classes)
    logits = rng.standard_normal((batch, classes)) * 3
    labels = rng.integers(0, classes, batch)
    loss, grad = ff.losses.softmax_cross_entropy(logits, labels)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert np.isclose(loss, -np.log(p[np.arange(batch), labels]).mean(), rtol=1e-12)
    np.testing.assert_allclose(
        grad, ref.fd(lambda z: float(ff.losses.softmax_cross_entropy(z, labels)[0]), logits),
        rtol=1e-6, atol=1e-9)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    loss, grad = ff.losses.softmax_cross_entropy(np.array([[1e4, 0.0, -1e4]], np.float32),
                                                 np.array([1]))
    assert np.isfinite(loss) and np.isclose(loss, 1e4) and np.isfinite(grad).all()


def test_mse_and_sigmoid_bce():
    rng = np.random.default_rng(0)
    out, tgt = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    loss, grad = ff.losses.mse(out, tgt)
    assert np.isclose(loss, ((out - tgt) ** 2).mean())
    np.testing.assert_allclose(grad, ref.fd(lambda z: float(ff.losses.mse(z, tgt)[0]), out),
                               rtol=1e-6)
    t01 = (rng.random((4, 3)) > 0.5).astype(float)
    loss, grad = ff.losses.sigmoid_binary_cross_entropy(out, t01)
    s = 1 / (1 + np.exp(-out))
    assert np.isclose(loss, -(t01 * np.log(s) + (1 - t01) * np.log(1 - s)).mean())
    np.testing.assert_allclose(
        grad, ref.fd(lambda z: float(ff.losses.sigmoid_binary_cross_entropy(z, t01)[0]), out),
        rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_bce_is_stable_at_extreme_logits(dtype):
    """Logits of +-1000 (a saturated unit) give the exact loss and gradient with no
    floating-point warning: the sigmoid is computed from exp(-|x|), which never overflows."""
    logits = np.array([[-1000.0, -40.0, 0.0, 40.0, 1000.0]], dtype=dtype)
    targets = np.array([[0.0, 1.0, 0.5, 0.0, 1.0]], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        loss, grad = ff.losses.sigmoid_binary_cross_entropy(logits, targets)
    # per logit: softplus(x) - x t = 0, 40, log 2, 40, 0; sigmoid = 0, ~0, 1/2, ~1, 1
    np.testing.assert_allclose(loss, (80 + np.log(2)) / 5, rtol=1e-6)
    sig = np.array([[0.0, np.exp(-40.0), 0.5, 1 - np.exp(-40.0), 1.0]])
    np.testing.assert_allclose(grad, (sig - targets) / 5, rtol=1e-6, atol=1e-30)
    assert grad.dtype == dtype


def test_float16_logits_reduce_in_float32():
    logits = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float16)
    labels = np.arange(64) % 10
    loss, grad = ff.losses.softmax_cross_entropy(logits, labels)
    ref, _ = ff.losses.softmax_cross_entropy(logits.astype(np.float64), labels)
    assert grad.dtype == np.float16 and abs(float(loss) - float(ref)) < 1e-5


def test_random_keys_are_reproducible_and_independent():
    k = ff.random.key(42)
    a, b = ff.random.split(k)
    np.testing.assert_array_equal(ff.random.normal(a, (5,)), ff.random.normal(a, (5,)))
    assert not np.array_equal(ff.random.normal(a, (5,)), ff.random.normal(b, (5,)))
    np.testing.assert_array_equal(ff.random.split(k, 3), ff.random.split(ff.random.key(42), 3))
    assert not np.array_equal(ff.random.fold_in(k, 1), ff.random.fold_in(k, 2))
    assert sorted(ff.random.permutation(k, 10)) == list(range(10))
    with pytest.raises(TypeError, match="seed must be an int"):
        ff.random.key(1.5)


def test_tree_helpers():
    t = {"a": np.ones(3), "b": [np.zeros((2, 2)), None], "c": (np.full(1, 2.0),)}
    assert ff.tree.paths(t) == ["a", "b/0", "c/0"]
    assert ff.tree.size(t) == 8
    z = ff.tree.zeros_like(t)
    assert all((leaf == 0).all() for leaf in ff.tree.leaves(z))
    assert ff.tree.structure(z) == ff.tree.structure(t)
    assert float(ff.tree.l2_norm(t)) == pytest.approx(np.sqrt(3 + 4))
    assert float(ff.tree.vdot(t, t)) == pytest.approx(7)
    doubled = ff.tree.scale(t, 2.0)
    assert float(ff.tree.l2_norm(ff.tree.sub(doubled, t))) == pytest.approx(np.sqrt(7))


def test_tree_builders_and_arithmetic_on_random_trees():
    rng = np.random.default_rng(7)
    t = {"w": rng.standard_normal((3, 4)), "layers": (rng.standard_normal(5), None)}
    u = ff.tree.map(lambda x: rng.standard_normal(x.shape), t)
    full = ff.tree.full_like(t, 0.5)
    assert all(np.array_equal(f, np.full_like(x, 0.5))
               for f, x in zip(ff.tree.leaves(full), ff.tree.leaves(t)))
    assert all((x == 1).all() for x in ff.tree.leaves(ff.tree.ones_like(t)))
    summed = ff.tree.add(t, u)
    assert all(np.array_equal(s, x + y) for s, x, y in
               zip(ff.tree.leaves(summed), ff.tree.leaves(t), ff.tree.leaves(u)))
    half = ff.tree.astype(t, np.float16)
    assert {x.dtype for x in ff.tree.leaves(half)} == {np.dtype(np.float16)}
    # float16 squares sum in float32: 300 values of 300 would overflow float16 (max 65504)
    big = {"a": np.full(300, 300, np.float16)}
    assert float(ff.tree.l2_norm(big)) == pytest.approx(300 * np.sqrt(300), rel=1e-3)
    assert ff.tree.all_equal_structure(t, u) and ff.tree.all_equal_structure(t, full)
    assert not ff.tree.all_equal_structure(t, {"w": t["w"], "layers": (t["w"],)})
    leaves, treedef = ff.tree.flatten(t)
    again = ff.tree.unflatten(treedef, leaves)
    assert ff.tree.all_equal_structure(again, t)
    assert all(x is y for x, y in zip(ff.tree.leaves(again), ff.tree.leaves(t)))


def test_fold_in_keys_are_not_keys_that_split_gives():
    k = ff.random.key(3)
    split = {tuple(s) for s in ff.random.split(k, 1000)}
    folded = {tuple(ff.random.fold_in(k, i)) for i in range(1000)}
    assert not split & folded and len(folded) == 1000
