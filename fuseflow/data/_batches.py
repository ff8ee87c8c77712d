"""Mini-batches over a pair of arrays, reproducible from a key and resumable mid-epoch.

The order of an epoch is ``fuseflow.random.permutation(key, n)``: a function of the key
alone, drawn on the host, so the same key gives the same batches on NumPy and on CuPy, and
a run restarted from a checkpoint at batch ``k`` of an epoch continues bit-for-bit with
``start_batch=k``. Use a new key per epoch, e.g. ``ff.random.fold_in(key, epoch)``.

CuPy arrays stay on the GPU: only the permutation is copied there, once per epoch. The
rows of an epoch are gathered in that order once (up to ``EPOCH_GATHER_MAX_BYTES``), and
each batch is a contiguous slice of the gathered copy: one gather per epoch instead of two
per batch, which on a GPU is host time a short training step cannot hide.
"""

from __future__ import annotations

import math

import numpy as np

from fuseflow import random
from fuseflow._namespace import is_array, namespace

__all__ = ["batches", "num_batches"]

#: Data sets up to this size (x and y together) are gathered once per epoch; larger ones
#: one batch at a time, so that an epoch never holds a second copy of a large data set.
EPOCH_GATHER_MAX_BYTES = 2 ** 30


def num_batches(n: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches ``batches`` yields for ``n`` examples."""
    batch_size = _check_batch_size(batch_size, "ff.data.num_batches")
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def _as_index(where, name, value, example, what="an int") -> int:
    """``value`` as a Python int (``random._integer``: an int, a NumPy integer or a 0-d
    integer array); anything else is a ValueError naming ``name``."""
    as_int = random._integer(value)
    if as_int is not None:
        return as_int
    hint = example
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        hint = str(int(value))
    raise ValueError(f"{where}: {name} must be {what} (a Python or NumPy integer), got "
                     f"{type(value).__name__} {value!r}. Fix: {name}={hint}.")


def _check_batch_size(batch_size, where="ff.data.batches", name="batch_size") -> int:
    """``batch_size`` as a positive Python int, else a ValueError naming ``where`` and the
    argument's ``name``."""
    batch_size = _as_index(where, name, batch_size, "64", "a positive int")
    if batch_size < 1:
        raise ValueError(f"{where}: {name} must be a positive int, got {batch_size}. "
                         f"Fix: {name} >= 1, e.g. {name}=64.")
    return batch_size


def batches(x, y, batch_size: int, *, key=None, shuffle: bool = True,
            drop_last: bool = False, start_batch: int = 0):
    """Yield ``(xb, yb)`` pairs of ``batch_size`` rows (the last one smaller unless
    ``drop_last``), skipping the first ``start_batch`` batches.

    With ``shuffle`` (the default) the rows are taken in the order
    ``fuseflow.random.permutation(key, len(x))``, so ``key`` is required. Without it, the
    batches are slices (views) of ``x`` and ``y`` in order.
    """
    for name, a in (("x", x), ("y", y)):
        if not is_array(a):
            raise TypeError(f"ff.data.batches: {name} must be a NumPy or CuPy array, got a "
                            f"{type(a).__name__}. Fix: {name} = np.asarray({name}) (or "
                            f"cupy.asarray({name}) for data on the GPU).")
    n = len(x)
    if len(y) != n:
        raise ValueError(f"batches: x has {n} rows but y has {len(y)}; they must match "
                         "(one label per example)")
    batch_size = _check_batch_size(batch_size, "ff.data.batches")
    start_batch = _as_index("ff.data.batches", "start_batch", start_batch, "0")
    total = num_batches(n, batch_size, drop_last)
    if not 0 <= start_batch <= total:
        raise ValueError(f"batches: start_batch={start_batch} is outside 0..{total} "
                         f"({n} examples make {total} batches of {batch_size})")
    if shuffle and key is None:
        raise ValueError("batches(shuffle=True) needs a key, so the order is reproducible. "
                         "Fix: batches(x, y, batch_size, key=ff.random.fold_in(key, epoch)), "
                         "or shuffle=False.")
    order = random.permutation(key, n) if shuffle else None
    return _generate(x, y, batch_size, order, start_batch, total)


def _generate(x, y, batch_size, order, start_batch, total):
    if order is None:
        for i in range(start_batch, total):
            rows = slice(i * batch_size, (i + 1) * batch_size)
            yield x[rows], y[rows]
        return
    order = order[start_batch * batch_size: total * batch_size]
    # each array is indexed by a copy of the order on its own device
    yield from in_order(x, y, namespace(x).asarray(order), namespace(y).asarray(order),
                        batch_size)


def in_order(x, y, x_order, y_order, batch_size):
    """Batches of ``batch_size`` rows of x and y taken in ``x_order``/``y_order`` (the same
    indices, each on its array's device): the rows gathered once, then sliced, when the data
    set is at most ``EPOCH_GATHER_MAX_BYTES``; else gathered batch by batch."""
    whole = x.nbytes + y.nbytes <= EPOCH_GATHER_MAX_BYTES
    if whole:
        x, y = x[x_order], y[y_order]
    for start in range(0, len(x_order), batch_size):
        rows = slice(start, start + batch_size)
        yield (x[rows], y[rows]) if whole else (x[x_order[rows]], y[y_order[rows]])
