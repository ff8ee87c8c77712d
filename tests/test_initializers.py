"""The weight initializers: each one's distribution (variance, bounds) against its formula,
on fresh keys and large samples, and their use as a Dense layer's ``w_init``."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow.nn import initializers as I

SHAPE = (300, 800)  # (out, in): fan_in 800, fan_out 300, 240,000 samples


def _sample(init, seed, shape=SHAPE, dtype=np.float32):
    x = init(ff.random.key(seed), shape, dtype)
    assert x.shape == shape and x.dtype == dtype
    return x.astype(np.float64)


@pytest.mark.parametrize("init, var, bound", [
    (I.he_normal(), 2 / 800, 2 * np.sqrt(2 / 800) / 0.87962566103423978),
    (I.lecun_normal(), 1 / 800, 2 * np.sqrt(1 / 800) / 0.87962566103423978),
    (I.he_uniform(), 2 / 800, np.sqrt(3 * 2 / 800)),
    (I.glorot_uniform(), 1 / 550, np.sqrt(3 / 550)),
    (I.variance_scaling(0.5, "fan_out", "normal"), 0.5 / 300, None),
])
@pytest.mark.parametrize("seed", [11, 12])
def test_variance_scaling_has_the_variance_and_bounds_of_its_formula(init, var, bound, seed):
    x = _sample(init, seed)
    # the sample variance of 240,000 draws is within 2% of the true one (about 7 sigma)
    assert x.var() == pytest.approx(var, rel=0.02)
    assert abs(x.mean()) < 5 * np.sqrt(var / x.size)
    if bound is not None:
        assert np.abs(x).max() <= bound * (1 + 1e-6)
        assert np.abs(x).max() > 0.95 * bound  # the bound is reached, not a tighter one


def test_initializers_are_functions_of_the_key():
    init = I.he_normal()
    a, b = _sample(init, 3), _sample(init, 3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _sample(init, 4))


def test_plain_initializers():
    key = ff.random.key(0)
    assert np.array_equal(I.zeros(key, (2, 3)), np.zeros((2, 3), np.float32))
    assert np.array_equal(I.ones(key, (2,), np.float16), np.ones(2, np.float16))
    assert np.array_equal(I.constant(0.25)(key, (3,)), np.full(3, 0.25, np.float32))
    x = _sample(I.normal(0.1), 5)
    assert x.std() == pytest.approx(0.1, rel=0.02)
    u = _sample(I.uniform(0.3), 6)
    assert -0.3 <= u.min() < -0.29 and 0.29 < u.max() <= 0.3


def test_bias_shapes_use_their_length_as_fan():
    x = _sample(I.he_uniform(), 7, shape=(50_000,))
    assert x.var() == pytest.approx(2 / 50_000, rel=0.03)


def test_bad_arguments_are_named_when_the_initializer_is_made():
    with pytest.raises(ValueError, match="unknown distribution 'cauchy'"):
        I.variance_scaling(1.0, "fan_in", "cauchy")
    with pytest.raises(ValueError, match="unknown mode 'fan_sum'"):
        I.variance_scaling(1.0, "fan_sum")


def test_dense_takes_any_initializer():
    layer = ff.nn.Dense(64, "relu", w_init=I.glorot_uniform(), b_init=I.constant(0.1))
    out_shape, params = layer.init(ff.random.key(0), (100,))
    assert out_shape == (64,)
    w = np.asarray(params["w"], np.float64)
    assert w.shape == (64, 100)
    assert np.abs(w).max() <= np.sqrt(6 / 164) * (1 + 1e-6)
    assert np.array_equal(params["b"], np.full(64, 0.1, np.float32))
