"""Real handwritten digits that need no download: scikit-learn's 8x8 ``load_digits``.

1797 images of 8x8 pixels with values 0..16, from the UCI optical digits set. This is the
offline fallback for the CLI and for quick tests: small enough to train on in seconds,
real enough that accuracy means something.

The split is fixed and deterministic: within each class, the examples are ordered by
``fuseflow.random.permutation(key(0), n)`` and the first 20% (rounded) go to "test", so both
splits keep the class balance. Each split is returned in the original order of the data set.
"""

from __future__ import annotations

import functools

import numpy as np

from fuseflow import random

__all__ = ["digits"]

_TEST_FRACTION = 0.2


@functools.lru_cache(maxsize=1)
def _load():
    from sklearn.datasets import load_digits  # slow import, only when digits are asked for

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = random.permutation(random.key(0), len(y))
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        members = order[y[order] == c]
        test[members[:round(_TEST_FRACTION * len(members))]] = True
    for a in (x, y, test):
        a.flags.writeable = False
    return x, y, test


def digits(split: str = "train"):
    """``(images, labels)``: float32 (N, 64) in [0, 1] and int64 (N,) labels 0..9.

    "train" has 1438 examples, "test" 359 (see the module docstring for the split).
    """
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
    x, y, test = _load()
    keep = test if split == "test" else ~test
    return x[keep], y[keep]
