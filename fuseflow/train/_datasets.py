"""The data sets the CLI trains on: MNIST, any folder of the four IDX files, and
scikit-learn's digits, the offline fallback.

Why digits: they ship inside scikit-learn, a declared dependency, so they are there on any
install with no network; and they are real handwritten digits (1797 8x8 images), so an
offline run still trains a real classifier rather than on noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from fuseflow import data

__all__ = ["Dataset", "load_dataset", "load_split", "DATASETS"]

DATASETS = ("mnist", "digits")


class Dataset(NamedTuple):
    name: str              # "mnist", "digits" or "idx"
    data_dir: str | None   # the IDX folder (absolute), None for the default places
    train: tuple           # (x float32 (N, input_width), y int64 (N,))
    test: tuple
    input_width: int
    classes: int
    note: str | None       # one line to show the user (the digits fallback), else None

    def describe(self) -> str:
        source = {"mnist": "MNIST", "digits": "scikit-learn digits (8x8)"}.get(
            self.name, f"IDX files in {self.data_dir}")
        return (f"data: {source}: {len(self.train[0])} train, {len(self.test[0])} test, "
                f"{self.input_width} inputs, {self.classes} classes")


def load_split(name: str, data_dir, split: str):
    """``(x, y)`` of one split: ``name`` "digits", "mnist" (default places, may download), or
    "idx"/"mnist" with ``data_dir`` (that folder, or its ``mnist/``; never elsewhere)."""
    if name == "digits":
        return data.digits(split)
    if data_dir is not None:
        return _idx_folder(Path(data_dir), split)
    if name == "mnist":
        return data.mnist(split)
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}, "
                     "or a --data-dir")


def _idx_folder(folder: Path, split: str):
    try:
        return data.idx_dataset(folder, split, num_classes=None)
    except data.DatasetNotFoundError:
        if (folder / "mnist").is_dir():
            return data.idx_dataset(folder / "mnist", split, num_classes=None)
        raise


def load_dataset(name: str = "mnist", data_dir=None, *, fallback: bool = False) -> Dataset:
    """Both splits, with the input width and class count read from the data.

    With ``fallback`` and no ``data_dir``, MNIST that is nowhere and cannot be downloaded
    becomes scikit-learn's digits, and ``note`` says so.
    """
    note = None
    if data_dir is not None:
        data_dir = str(Path(data_dir).resolve())
        name = "idx" if name != "digits" else name
    try:
        train = load_split(name, data_dir, "train")
        test = load_split(name, data_dir, "test")
    except data.DatasetNotFoundError:
        if not (fallback and name == "mnist" and data_dir is None):
            raise
        note = ("MNIST not found locally and not downloadable (offline?); training on "
                "scikit-learn's digits instead (for MNIST: --data-dir DIR or FUSEFLOW_DATA)")
        name = "digits"
        train, test = data.digits("train"), data.digits("test")
    classes = int(max(np.max(train[1]), np.max(test[1]))) + 1
    return Dataset(name, data_dir, train, test, int(train[0].shape[1]), classes, note)
