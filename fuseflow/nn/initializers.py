"""Weight initializers: ``init(key, shape, dtype) -> array`` (host NumPy arrays).

Dense weights are ``(out, in)``, so fan_in is ``shape[1]`` and fan_out ``shape[0]``.
"""

from __future__ import annotations

import numpy as np

from fuseflow import random


def zeros(key, shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def ones(key, shape, dtype=np.float32):
    return np.ones(shape, dtype)


def constant(value):
    def init(key, shape, dtype=np.float32):
        return np.full(shape, value, dtype)
    return init


def normal(stddev=1e-2):
    def init(key, shape, dtype=np.float32):
        x = random.normal(key, shape, np.float64)
        x *= stddev  # in place: a large layer's float64 draw is not held twice
        return x.astype(dtype, copy=False)
    return init


def uniform(scale=1e-2):
    def init(key, shape, dtype=np.float32):
        return random.uniform(key, shape, -scale, scale, np.float64).astype(dtype, copy=False)
    return init


def _fans(shape):
    if len(shape) < 2:
        return shape[0], shape[0]
    return int(np.prod(shape[1:])), shape[0]


_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("truncated_normal", "normal", "uniform")


def variance_scaling(scale, mode="fan_in", distribution="truncated_normal"):
    """Samples with variance ``scale / fan`` (fan_in, fan_out or their average)."""
    if mode not in _MODES:
        raise ValueError(f"variance_scaling: unknown mode {mode!r}; expected one of "
                         f"{', '.join(map(repr, _MODES))}")
    if distribution not in _DISTRIBUTIONS:
        raise ValueError(f"variance_scaling: unknown distribution {distribution!r}; expected "
                         f"one of {', '.join(map(repr, _DISTRIBUTIONS))}")

    def init(key, shape, dtype=np.float32):
        fan_in, fan_out = _fans(shape)
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        var = scale / max(1.0, fan)
        if distribution == "truncated_normal":
            # std of a standard normal truncated to [-2, 2]
            std_of_truncated = 0.87962566103423978  # a standard normal cut at +-2
            x = random.truncated_normal(key, shape, dtype=np.float64)
            x *= np.sqrt(var)  # in place (same bits): the float64 draw is not held twice
            x /= std_of_truncated
        elif distribution == "normal":
            x = random.normal(key, shape, np.float64)
            x *= np.sqrt(var)
        else:  # "uniform"
            lim = np.sqrt(3.0 * var)
            x = random.uniform(key, shape, -lim, lim, np.float64)
        return x.astype(dtype, copy=False)
    return init


def glorot_uniform():
    return variance_scaling(1.0, "fan_avg", "uniform")


def lecun_normal():
    return variance_scaling(1.0, "fan_in", "truncated_normal")


def he_normal():
    return variance_scaling(2.0, "fan_in", "truncated_normal")


def he_uniform():
    return variance_scaling(2.0, "fan_in", "uniform")
