"""Batches from a data set that lives on the GPU: no host-to-device traffic in an epoch.

``batches`` draws each epoch's order on the host (bit-identical across backends, which is
what resuming and the CPU/GPU equivalence tests need) and copies it to the device once per
epoch. ``device_batches`` draws the order on the device instead (CuPy's generator seeded
from the key; on NumPy arrays NumPy's), for the fastest loop on a GPU: the epoch's rows
are gathered from the resident arrays once (up to ``EPOCH_GATHER_MAX_BYTES``) and each
batch is a slice; nothing crosses the bus.
"""

from __future__ import annotations

from fuseflow._namespace import namespace
from fuseflow.data._batches import in_order, num_batches

__all__ = ["device_batches"]


def device_batches(x, y, batch_size: int, *, key, drop_last: bool = True):
    """Yield ``(xb, yb)`` gathered on the arrays' device in an order drawn there from ``key``."""
    n = len(x)
    if len(y) != n:
        raise ValueError(f"device_batches: x has {n} rows but y has {len(y)}")
    xp = namespace(x)
    seed = (int(key[0]) << 32 | int(key[1])) % (2 ** 63)
    if xp.__name__ == "numpy":  # NumPy's RandomState takes 32-bit seeds, its Generator any
        perm = xp.random.default_rng(seed).permutation(n)
    else:
        perm = xp.random.RandomState(seed).permutation(n)
    perm = perm[:num_batches(n, batch_size, drop_last) * batch_size]
    yield from in_order(x, y, perm, perm, batch_size)
