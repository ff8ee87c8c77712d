"""Data for training: MNIST-style IDX data sets, offline digits, and mini-batches.

    x, y = ff.data.mnist("train")                 # float32 (60000, 784), int64 (60000,)
    for xb, yb in ff.data.batches(x, y, 128, key=ff.random.fold_in(key, epoch)):
        ...

Where MNIST is looked for, and how it is downloaded and verified, is described in
``fuseflow/data/_mnist.py``.
"""

from fuseflow.data._batches import batches, num_batches
from fuseflow.data._device import device_batches
from fuseflow.data._digits import digits
from fuseflow.data._errors import DatasetError, DatasetNotFoundError
from fuseflow.data._idx import read_idx
from fuseflow.data._mnist import cache_dir, idx_dataset, mnist

__all__ = ["DatasetError", "DatasetNotFoundError", "batches", "cache_dir", "device_batches",
           "digits", "idx_dataset", "mnist", "num_batches", "read_idx"]
