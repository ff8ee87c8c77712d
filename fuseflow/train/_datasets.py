"""The data sets the CLI trains on: MNIST, any folder of the four IDX files, and
scikit-learn's digits, the offline fallback.

Why digits: they ship inside scikit-learn, a declared dependency, so they are there on any
install with no network; and they are real handwritten digits (1797 8x8 images), so an
offline run still trains a real classifier rather than on noise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fuseflow import data
from fuseflow.data._idx import read_split
from fuseflow.data._mnist import _FILES, _as_arrays, _find

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


class _Source(NamedTuple):
    """Where a split's arrays came from, for error messages."""
    images: str                  # the images file (or a description when unknown)
    labels: str
    image_shape: tuple | None    # (rows, cols) of one image, when read from IDX here


def load_split(name: str, data_dir, split: str):
    """``(x, y)`` of one split: ``name`` "digits", "mnist" (default places, may download), or
    "idx"/"mnist" with ``data_dir`` (that folder, or its ``mnist/``; never elsewhere)."""
    x, y, _ = _load_split(name, data_dir, split)
    return x, y


def _load_split(name: str, data_dir, split: str):
    if name == "digits":
        _no_folder_for_digits(data_dir)
        x, y = data.digits(split)
        return x, y, _Source(f"scikit-learn digits ({split})", f"digits {split} labels", None)
    if data_dir is not None:
        return _idx_folder(Path(data_dir), split)
    if name == "mnist":
        images, labels = _FILES[split]
        x, y = data.mnist(split)
        return x, y, _Source(f"MNIST's {images}", f"MNIST's {labels}", None)
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}, "
                     "or a --data-dir")


def _no_folder_for_digits(data_dir):
    if data_dir is not None:
        raise ValueError(f"data_dir={str(data_dir)!r} does not apply to the digits data set "
                         "(it ships inside scikit-learn and reads no folder). Fix: leave "
                         "data_dir out, or name 'idx' to read the IDX files there.")


def _idx_folder(folder: Path, split: str):
    """The split from the IDX files in ``folder`` (or in its ``mnist/``)."""
    names = _FILES[split]
    files = _find(folder, names)
    if files is None and (folder / "mnist").is_dir():
        files = _find(folder / "mnist", names)
    if files is None:  # the error that names the files and the folder
        return (*data.idx_dataset(folder, split, num_classes=None), None)
    images, labels = read_split(*files, num_classes=None)
    return (*_as_arrays(images, labels),
            _Source(str(files[0]), str(files[1]), tuple(images.shape[1:])))


def load_dataset(name: str = "mnist", data_dir=None, *, fallback: bool = False) -> Dataset:
    """Both splits, with the input width and class count read from the data.

    With ``fallback`` and no ``data_dir``, MNIST that is nowhere and cannot be downloaded
    becomes scikit-learn's digits, and ``note`` says so. The two splits are checked against
    each other: the same image size, training labels that cover every class ``0..max`` (a
    gap is what one damaged label byte leaves), and no test label beyond them.
    """
    note = None
    if data_dir is not None:
        if name == "digits":
            _no_folder_for_digits(data_dir)
        data_dir = str(Path(data_dir).resolve())
        name = "idx"
    try:
        train = _load_split(name, data_dir, "train")
        test = _load_split(name, data_dir, "test")
    except data.DatasetNotFoundError:
        if not (fallback and name == "mnist" and data_dir is None):
            raise
        env = os.environ.get("FUSEFLOW_DATA")  # looked in first, so it holds none
        given = f"; FUSEFLOW_DATA={env} holds no MNIST IDX files" if env else ""
        note = (f"MNIST not found locally and not downloadable (offline?){given}; training "
                "on scikit-learn's digits instead (for MNIST: --data-dir DIR or FUSEFLOW_DATA)")
        name = "digits"
        train, test = _load_split(name, None, "train"), _load_split(name, None, "test")
    _check_same_inputs(train, test)
    classes = _check_labels(train, test)
    folders = {Path(split[2].images).parent for split in (train, test)} if name == "idx" else ()
    if len(folders) == 1:  # the folder that held both splits (``data_dir`` or its ``mnist/``)
        data_dir = str(folders.pop())
    return Dataset(name, data_dir, train[:2], test[:2], int(train[0].shape[1]), classes, note)


def _size(x, source: _Source) -> str:
    shape = source.image_shape
    pixels = f"{x.shape[1]} inputs"
    return f"{shape[0]}x{shape[1]} images ({pixels})" if shape else pixels


def _check_same_inputs(train, test):
    (x, _, src), (x_test, _, src_test) = train, test
    if x.shape[1] != x_test.shape[1] or src.image_shape != src_test.image_shape:
        raise data.DatasetError(
            f"{src_test.images}: holds {_size(x_test, src_test)}, but the training images in "
            f"{src.images} are {_size(x, src)}; the test and training images must be the same "
            "size. Fix: put the test files of the same data set beside the training files.")


def _check_labels(train, test) -> int:
    """The number of classes, after checking the labels of both splits against each other."""
    (_, y, src), (_, y_test, src_test) = train, test
    present, counts = np.unique(y, return_counts=True)
    classes = int(present[-1]) + 1
    if int(present[0]) < 0:
        raise data.DatasetError(f"{src.labels}: label {int(present[0])} is negative; labels "
                                "are class indices 0..K-1. Fix: relabel the classes as 0..K-1.")
    if len(present) < classes:  # a class without a single training example
        missing = np.setdiff1d(np.arange(classes), present)
        beyond = [(int(c), int(n)) for c, n in zip(present, counts) if c > missing[0]]
        odd = ", ".join(f"label {c} ({n} example{'s' * (n > 1)}, the first at index "
                        f"{int(np.argmax(y == c))})" for c, n in beyond[:3])
        raise data.DatasetError(
            f"{src.labels}: the labels go up to {classes - 1}, but {len(missing)} of the "
            f"classes 0..{classes - 1} have no training example ({_ranges(missing)}); beyond "
            f"the gap: {odd}{', ...' if len(beyond) > 3 else ''}. A gap like this is what a "
            "damaged label byte leaves, and the model would get an output for every "
            "missing class. Fix: restore the file from the original data set (for MNIST, delete it "
            "and download it again), or relabel the classes as 0..K-1 with every class in "
            "the training split.")
    bad = (y_test < 0) | (y_test >= classes)
    if bad.any():
        i = int(np.argmax(bad))
        raise data.DatasetError(
            f"{src_test.labels}: label {int(y_test[i])} at index {i} ({int(bad.sum())} such "
            f"label{'s' * (int(bad.sum()) > 1)}) is outside the classes 0..{classes - 1} of "
            f"the training labels in {src.labels}; no training example has it, so it is most "
            "likely a damaged byte. Fix: restore the file from the original data set (for "
            "MNIST, delete it and download it again).")
    return classes


def _ranges(values) -> str:
    """``[10, 11, 12, 15]`` -> ``"10..12, 15"`` (at most a few runs)."""
    runs, start, prev = [], int(values[0]), int(values[0])
    for v in map(int, values[1:]):
        if v != prev + 1:
            runs.append((start, prev))
            start = v
        prev = v
    runs.append((start, prev))
    text = ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs[:4])
    return text + (", ..." if len(runs) > 4 else "")
