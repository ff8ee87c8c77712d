"""Explicit, reproducible random keys, in the style of ``jax.random``.

A key is a small uint32 array of shape (2,). The same key always gives the same numbers;
``split`` derives independent keys. Numbers are drawn on the host with NumPy's Philox
generator, so a model initialised from a key is identical on every backend.
"""

from __future__ import annotations

import math
import operator

import numpy as np

__all__ = [
    "bernoulli",
    "fold_in",
    "generator",
    "key",
    "normal",
    "permutation",
    "randint",
    "split",
    "truncated_normal",
    "uniform",
]


def key(seed: int) -> np.ndarray:
    """A key from an integer seed: any 64-bit int (a negative seed is taken as its two's
    complement, as JAX does: ``key(-1) == key(2**64 - 1)``). Larger seeds are refused rather
    than wrapped onto smaller ones."""
    seed = _int64("ff.random.key", "seed", seed, "ff.random.key(0)")
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


def _int64(where, name, value, fix) -> int:
    """``value`` as a Python int in [0, 2**64) (negative 64-bit ints as two's complement)."""
    value = _as_int(where, name, value, fix)
    if not -2 ** 63 <= value < 2 ** 64:
        raise ValueError(f"{where}: {name} {value} does not fit in 64 bits. Fix: a {name} in "
                         f"[0, 2**64), e.g. {name} % 2**64.")
    return value & (2 ** 64 - 1)


def _as_int(where, name, value, fix) -> int:
    """An int, a NumPy integer or a 0-d integer array (as JAX takes them), as a Python int."""
    if not isinstance(value, (bool, np.bool_)) and getattr(value, "dtype", np.dtype(int)).kind \
            in "iu":
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}. "
                    f"Fix: {fix}.")


def _check_key(k, where="ff.random") -> np.ndarray:
    k = np.asarray(k)
    if k.shape != (2,) or k.dtype != np.uint32:
        raise TypeError(f"{where}: expected a key (uint32 array of shape (2,)), got dtype "
                        f"{k.dtype} shape {k.shape}. Fix: make keys with ff.random.key(seed) "
                        "and ff.random.split(key).")
    return k


def generator(k, where="ff.random.generator") -> np.random.Generator:
    """The NumPy generator a key stands for (Philox seeded by the key's 64 bits)."""
    k = _check_key(k, where)
    return np.random.Generator(np.random.Philox(key=(int(k[0]) << 32) | int(k[1])))


def split(k, num: int = 2) -> np.ndarray:
    """``num`` new independent keys, as an array of shape (num, 2)."""
    num = _as_int("ff.random.split", "num", num, "ff.random.split(key, 2)")
    if num < 0:
        raise ValueError(f"ff.random.split: num must be an int >= 0, got {num}. Fix: "
                         "ff.random.split(key, 2).")
    return generator(k, "ff.random.split").integers(0, 2**32, size=(num, 2), dtype=np.uint32)


_FOLD_IN_DOMAIN = 0x466F6C64  # keeps fold_in's keys apart from split's (a separate hash input)


def fold_in(k, data: int) -> np.ndarray:
    """A new key from a key and an integer (for example a step number).

    Hashed (SeedSequence) rather than drawn from the key's own stream, so that
    ``fold_in(k, s)`` never equals a key that ``split(k, n)`` returns.
    """
    k = _check_key(k, "ff.random.fold_in")
    data = _int64("ff.random.fold_in", "data", data, "fold_in(key, step) with an int step")
    seq = np.random.SeedSequence([int(k[0]), int(k[1]), data & 0xFFFFFFFF, data >> 32,
                                  _FOLD_IN_DOMAIN])
    return seq.generate_state(2, dtype=np.uint32)


def normal(k, shape, dtype=np.float32) -> np.ndarray:
    return generator(k).standard_normal(shape, dtype=np.float64).astype(dtype)


def truncated_normal(k, shape, lower=-2.0, upper=2.0, dtype=np.float32) -> np.ndarray:
    """Standard normal restricted to [lower, upper] (by resampling). The interval must hold
    at least 0.1% of the distribution (the default, [-2, 2], holds 95%): narrower ones, far in
    a tail, would need too many rounds and are refused."""
    cdf = np.vectorize(lambda v: 0.5 * math.erf(v / math.sqrt(2)), otypes=[float])
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)  # scalars or per element
    mass = float(np.min(np.where(lo < hi, cdf(hi) - cdf(lo), 0.0)))
    if not mass >= 1e-3:
        raise ValueError(f"ff.random.truncated_normal: [lower, upper] = [{lower}, {upper}] holds "
                         f"{mass:.2g} of the standard normal distribution; it must hold at "
                         "least 0.001 (lower < upper, not far in a tail). Fix: an interval "
                         "around 0, e.g. lower=-2.0, upper=2.0.")
    g = generator(k, "ff.random.truncated_normal")
    out = g.standard_normal(shape)
    bad = (out < lower) | (out > upper)
    while bad.any():
        out[bad] = g.standard_normal(int(bad.sum()))
        bad = (out < lower) | (out > upper)
    return out.astype(dtype)


def uniform(k, shape, minval=0.0, maxval=1.0, dtype=np.float32) -> np.ndarray:
    return generator(k).uniform(minval, maxval, size=shape).astype(dtype)


def bernoulli(k, p, shape) -> np.ndarray:
    """Boolean array, True with probability ``p``."""
    return generator(k).random(size=shape) < p


def permutation(k, n: int) -> np.ndarray:
    return generator(k).permutation(n)


def randint(k, shape, low, high, dtype=np.int64) -> np.ndarray:
    return generator(k).integers(low, high, size=shape, dtype=dtype)
