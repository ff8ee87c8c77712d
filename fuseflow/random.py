"""Explicit, reproducible random keys, in the style of ``jax.random``.

A key is a small uint32 array of shape (2,). The same key always gives the same numbers;
``split`` derives independent keys. Numbers are drawn on the host with NumPy's Philox
generator, so a model initialised from a key is identical on every backend.

``bits`` is the exception: a counter-based generator (Philox4x32-10, as Random123, cuRAND
and JAX's GPU kernels use) whose element i depends only on the key and i. So the same bits
can be computed where the data is, on the host here and by the GPU backend's kernel
(``Backend.random_bits``) inside a compiled step, bit for bit alike. Dropout draws its
masks from it, and ``Serial`` its layers' keys (``Backend.layer_keys``); before 2026-12-04
both came from NumPy's Philox, so a seed gives other masks than it did then.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from fuseflow._dtypes import is_float

__all__ = [
    "bernoulli",
    "bits",
    "fold_in",
    "generator",
    "keep_factor",
    "keep_threshold",
    "key",
    "normal",
    "permutation",
    "philox4x32",
    "randint",
    "split",
    "truncated_normal",
    "uniform",
]


def key(seed: int) -> np.ndarray:
    """A key from an integer seed: any 64-bit int (a negative seed is taken as its two's
    complement, as JAX's 64-bit mode does for ``PRNGKey(-1)``: ``key(-1) == key(2**64 -
    1)``). Larger seeds are refused rather than wrapped onto smaller ones."""
    seed = _int64("ff.random.key", "seed", seed, "ff.random.key(0)")
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


def _int64(where, name, value, fix) -> int:
    """``value`` as a Python int in [0, 2**64) (negative 64-bit ints as two's complement)."""
    value = _as_int(where, name, value, fix)
    if not -2 ** 63 <= value < 2 ** 64:
        raise ValueError(f"{where}: {name} {value} does not fit in 64 bits. Fix: a {name} in "
                         f"[0, 2**64), e.g. {name} % 2**64.")
    return value & (2 ** 64 - 1)


def _integer(value) -> int | None:
    """``value`` as a Python int if it is an int, a NumPy integer or a 0-d integer array (as
    JAX takes them); None for anything else (a bool, a float, even a whole one)."""
    if not isinstance(value, (bool, np.bool_)) and getattr(value, "dtype", np.dtype(int)).kind \
            in "iu":
        try:
            return operator.index(value)
        except TypeError:
            pass
    return None


def _as_int(where, name, value, fix) -> int:
    """``_integer(value)``, or a TypeError naming ``name`` and the fix."""
    as_int = _integer(value)
    if as_int is None:
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} "
                        f"{value!r}. Fix: {fix}.")
    return as_int


def _check_key(k, where="ff.random") -> np.ndarray:
    if type(k).__module__.startswith("cupy"):
        raise TypeError(f"{where}: the key is a GPU array, and ff.random draws on the host. "
                        "Fix: ff.backend.of(x).random_bits(key, shape) draws on the GPU (the "
                        "same bits), or pass a host key (ff.device_put(key, 'cpu')).")
    if k is None:
        raise TypeError(f"{where}: the key is None: nothing handed this draw a key. A layer "
                        "that draws random numbers declares draws_random = True, so that "
                        "Serial and ff.train.fit (compiled too) hand it one; in inference "
                        "(train=False) it should draw nothing. Fix: set draws_random = True "
                        "on the layer class, or pass key=ff.random.key(seed) yourself.")
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


def _float_dtype(where: str, dtype):
    """``dtype`` of a sampler of real numbers: a floating one, as in ``jax.random``; an
    integer one would truncate every draw (normal as int32 is mostly 0 and -1)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not is_float(dt):
        got = dt.name if dt is not None else repr(dtype)
        raise TypeError(f"{where}: dtype must be a floating dtype (float16, bfloat16, float32, "
                        f"float64), got {got}; an integer dtype would truncate the draws. Fix: "
                        "draw floats and round them yourself, or ff.random.randint for "
                        "integers.")
    return dt


def normal(k, shape, dtype=np.float32) -> np.ndarray:
    dtype = _float_dtype("ff.random.normal", dtype)
    return generator(k, "ff.random.normal").standard_normal(shape, dtype=np.float64) \
        .astype(dtype, copy=False)


def truncated_normal(k, shape, lower=-2.0, upper=2.0, dtype=np.float32) -> np.ndarray:
    """Standard normal restricted to [lower, upper] (by resampling). The interval must hold
    at least 0.1% of the distribution (the default, [-2, 2], holds 95%): narrower ones, far in
    a tail, would need too many rounds and are refused."""
    dtype = _float_dtype("ff.random.truncated_normal", dtype)
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
    return out.astype(dtype, copy=False)


def uniform(k, shape, minval=0.0, maxval=1.0, dtype=np.float32) -> np.ndarray:
    """Uniform in [minval, maxval), as ``jax.random.uniform``: drawn in float64 and rounded
    to ``dtype``. A draw that rounds up to ``maxval`` (float16: about 1 in 4,000 of [0, 1)),
    or to ``maxval`` as ``dtype`` rounds it (float16's 0.1 is 0.09998: ``x < 0.1`` on a
    float16 array compares with it), is the largest ``dtype`` value below it instead; every
    other value is the rounded draw."""
    dtype = _float_dtype("ff.random.uniform", dtype)
    out = generator(k, "ff.random.uniform").uniform(minval, maxval, size=shape) \
        .astype(dtype, copy=False)
    hi = np.asarray(maxval, np.float64)
    with np.errstate(over="ignore"):  # a maxval beyond the dtype rounds to inf: hi stays
        hi = np.minimum(hi, hi.astype(out.dtype))
    over = out >= hi  # compared in float64 (or wider)
    if over.any():
        below = np.nextafter(out, np.array(-np.inf, out.dtype))
        over &= below >= np.asarray(minval, np.float64)  # unless [minval, maxval) is empty
        out = np.where(over, below, out)
    return out


def bernoulli(k, p, shape) -> np.ndarray:
    """Boolean array, True with probability ``p``."""
    return generator(k, "ff.random.bernoulli").random(size=shape) < p


def permutation(k, n) -> np.ndarray:
    """A random order of ``range(n)`` (an int >= 0), or of an array's rows (a copy)."""
    g = generator(k, "ff.random.permutation")
    if np.ndim(n) == 0:
        n = _as_int("ff.random.permutation", "n", n, "permutation(key, len(x))")
        if n < 0:
            raise ValueError(f"ff.random.permutation: n must be an int >= 0, got {n}. Fix: "
                             "permutation(key, len(x)).")
    return g.permutation(n)


def randint(k, shape, low, high, dtype=np.int64) -> np.ndarray:
    """Integers in [low, high) (``high`` excluded, as ``jax.random.randint``)."""
    if not np.all(np.less(low, high)):
        raise ValueError(f"ff.random.randint: low must be below high (high is excluded), got "
                         f"low={low!r}, high={high!r}. Fix: high = the largest value wanted + 1,"
                         " e.g. randint(key, shape, 0, 10) for 0..9.")
    return generator(k, "ff.random.randint").integers(low, high, size=shape, dtype=dtype)


# ---- Philox4x32-10 (Salmon et al., SC 2011), the counter-based generator behind ``bits`` ----
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key schedule (Weyl) increments
_MASK32 = 0xFFFFFFFF


def philox4x32(counters, k):
    """Philox4x32-10 of the ``(4, n)`` uint32 ``counters`` under key ``k`` (two uint32): the
    ``(4, n)`` uint32 outputs. ``philox4x32([[0], [0], [0], [0]], [0, 0])`` gives
    Random123's known answer 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8."""
    c = [np.asarray(w, dtype=np.uint32) for w in counters]
    k0, k1 = int(k[0]) & _MASK32, int(k[1]) & _MASK32
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & _MASK32, (k1 + PHILOX_W[1]) & _MASK32
        p0 = m0 * c[0].astype(np.uint64)
        p1 = m1 * c[2].astype(np.uint64)
        c = [(p1 >> np.uint64(32)).astype(np.uint32) ^ c[1] ^ np.uint32(k0),
             p1.astype(np.uint32),
             (p0 >> np.uint64(32)).astype(np.uint32) ^ c[3] ^ np.uint32(k1),
             p0.astype(np.uint32)]
    return np.stack(c)


def bits(k, shape, stream: int = 0) -> np.ndarray:
    """Random uint32 bits of ``shape``: element i (in C order) is word ``i % 4`` of
    Philox4x32-10 under the key at counter ``(i // 4, stream, 0)`` (the 64-bit block index
    in the first two words; ``stream``, a uint32, keeps other uses of one key apart, as
    ``KEY_STREAM`` does). The GPU backend computes the same bits on the device
    (``Backend.random_bits``)."""
    k = _check_key(k, "ff.random.bits")
    shape = _shape("ff.random.bits", shape)
    n = math.prod(shape)
    blocks = np.arange(-(-n // 4), dtype=np.uint64)
    zeros = np.zeros(blocks.shape, dtype=np.uint32)
    streams = np.full(blocks.shape, check_stream(stream), dtype=np.uint32)
    out = philox4x32([blocks.astype(np.uint32), (blocks >> np.uint64(32)).astype(np.uint32),
                      streams, zeros], k)
    return np.ascontiguousarray(out.T).reshape(-1)[:n].reshape(shape)


def _shape(where, shape) -> tuple:
    """``shape`` (an int or a sequence of them, not bools) as a tuple of ints >= 0;
    a negative or non-integer size is refused (NumPy's and CuPy's arrays refuse them too)."""
    if _integer(shape) is not None:
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    sizes = None if dims is None else [_integer(d) for d in dims]
    if sizes is None or None in sizes:
        raise TypeError(f"{where}: shape must be an int or a tuple of ints, got {shape!r}. "
                        "Fix: a shape such as (64, 10).")
    if min(sizes, default=0) < 0:
        raise ValueError(f"{where}: shape {tuple(sizes)} has a negative size. Fix: sizes >= 0.")
    return tuple(sizes)


#: ``bits``' stream of the keys a model derives for its layers from the key it is given
#: (``Backend.layer_keys``): apart from the bits the key draws itself (stream 0)
KEY_STREAM = 0x6B657973  # "keys"


def keep_threshold(rate: float) -> int:
    """The bound below which ``bits`` keep an element, for dropping with probability
    ``rate`` in [0, 1): floor((1 - rate) * 2**32), so P(keep) is 1 - rate to within 2**-32
    (2**32 at rate 0: every element is kept). Computed in float64 (a float32 rate too)."""
    return int((1.0 - float(rate)) * 2 ** 32)


def keep_factor(rate: float, dtype) -> np.generic:
    """What a kept element is multiplied by, for dropping with probability ``rate``:
    ``1 / (1 - rate)`` rounded once to ``dtype`` (inf where it overflows the dtype)."""
    with np.errstate(over="ignore"):
        return np.dtype(dtype).type(1.0 / (1.0 - float(rate)))


def check_stream(stream) -> int:
    """``stream`` as an int in [0, 2**32) (the counter word ``bits`` gives it)."""
    value = _as_int("ff.random.bits", "stream", stream, "stream=0")
    if not 0 <= value <= _MASK32:
        raise ValueError(f"ff.random.bits: stream must be in [0, 2**32), got {value}. Fix: "
                         "a uint32 such as stream=1.")
    return value
