"""Explicit, reproducible random keys, in the style of ``jax.random``.

A key is a small uint32 array of shape (2,). The same key always gives the same numbers;
``split`` derives independent keys. Numbers are drawn on the host with NumPy's Philox
generator, so a model initialised from a key is identical on every backend.
"""

from __future__ import annotations

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
    """A key from an integer seed: any 64-bit int (a negative one is taken as its
    two's complement, as JAX does). Larger seeds are refused rather than wrapped, so that two
    different seeds never give the same key."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"ff.random.key: seed must be an int, got {type(seed).__name__}. "
                        "Fix: ff.random.key(0).")
    seed = int(seed)
    if not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"ff.random.key: seed {seed} does not fit in 64 bits. Fix: a seed in "
                         "[0, 2**64), e.g. seed % 2**64.")
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


def _check_key(k) -> np.ndarray:
    k = np.asarray(k)
    if k.shape != (2,) or k.dtype != np.uint32:
        raise TypeError(f"expected a key (uint32 array of shape (2,)), got dtype {k.dtype} "
                        f"shape {k.shape}. Fix: make keys with ff.random.key(seed) and "
                        "ff.random.split(key).")
    return k


def generator(k) -> np.random.Generator:
    """The NumPy generator a key stands for (Philox seeded by the key's 64 bits)."""
    k = _check_key(k)
    return np.random.Generator(np.random.Philox(key=(int(k[0]) << 32) | int(k[1])))


def split(k, num: int = 2) -> np.ndarray:
    """``num`` new independent keys, as an array of shape (num, 2)."""
    return generator(k).integers(0, 2**32, size=(num, 2), dtype=np.uint32)


_FOLD_IN_DOMAIN = 0x466F6C64  # keeps fold_in's keys apart from split's (a separate hash input)


def fold_in(k, data: int) -> np.ndarray:
    """A new key from a key and an integer (for example a step number).

    Hashed (SeedSequence) rather than drawn from the key's own stream, so that
    ``fold_in(k, s)`` never equals a key that ``split(k, n)`` returns.
    """
    k = _check_key(k)
    data = int(data) & (2**64 - 1)
    seq = np.random.SeedSequence([int(k[0]), int(k[1]), data & 0xFFFFFFFF, data >> 32,
                                  _FOLD_IN_DOMAIN])
    return seq.generate_state(2, dtype=np.uint32)


def normal(k, shape, dtype=np.float32) -> np.ndarray:
    return generator(k).standard_normal(shape, dtype=np.float64).astype(dtype)


def truncated_normal(k, shape, lower=-2.0, upper=2.0, dtype=np.float32) -> np.ndarray:
    """Standard normal restricted to [lower, upper] (by resampling)."""
    g = generator(k)
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
