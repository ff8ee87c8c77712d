"""Batches from a data set that lives on the GPU: no host-to-device traffic in an epoch.

``batches`` draws each epoch's order on the host (bit-identical across backends, which is
what resuming and the CPU/GPU equivalence tests need) and copies it to the device once per
epoch. ``device_batches`` draws the order on the device instead (CuPy's generator seeded
from the key; on NumPy arrays NumPy's), for the fastest loop on a GPU: the epoch's rows
are gathered from the resident arrays once (up to ``EPOCH_GATHER_MAX_BYTES``) and each
batch is a slice; nothing crosses the bus.
"""

from __future__ import annotations

from fuseflow import random
from fuseflow._namespace import is_cupy, namespace
from fuseflow.data._batches import _check_batch_size, in_order, num_batches

__all__ = ["device_batches"]

_WHERE = "ff.data.device_batches"


def device_batches(x, y, batch_size: int, *, key, drop_last: bool = True):
    """Yield ``(xb, yb)`` gathered on the arrays' device in an order drawn there from ``key``.

    The arguments are checked here, at the call, not when iteration starts.
    """
    n = len(x)
    if len(y) != n:
        raise ValueError(f"{_WHERE}: x has {n} rows but y has {len(y)}; they must match "
                         "(one label per example)")
    batch_size = _check_batch_size(batch_size, _WHERE)
    if key is None:
        raise ValueError(f"{_WHERE} needs a key, so the order is reproducible. Fix: "
                         "device_batches(x, y, batch_size, key=ff.random.fold_in(key, epoch)).")
    if is_cupy(key):  # a key on the GPU: its 8 bytes to the host
        key = key.get()
    key = random._check_key(key, _WHERE)
    xp = namespace(x)
    # the key's low 63 bits seed the order (kept so: recorded runs' orders depend on it);
    # keys from split/fold_in share them with odds of 2**-63
    seed = (int(key[0]) << 32 | int(key[1])) % (2 ** 63)
    total = num_batches(n, batch_size, drop_last)
    return _generate(x, y, xp, seed, n, total * batch_size, batch_size)


def _generate(x, y, xp, seed, n, rows, batch_size):
    if xp.__name__ == "numpy":  # NumPy's RandomState takes 32-bit seeds, its Generator any
        perm = xp.random.default_rng(seed).permutation(n)
    else:
        perm = xp.random.RandomState(seed).permutation(n)
    yield from in_order(x, y, perm[:rows], perm[:rows], batch_size)
