"""Reading IDX files, the format of MNIST and its look-alikes, with structural checks.

An IDX file is two zero bytes, a data type code, the number of dimensions, one big-endian
uint32 per dimension, then the values in big-endian C order; it ships gzip-compressed or
raw. A download cut short, a disk error, or swapped images and labels files all show up
here rather than as a strange loss curve later, so every check says which file failed,
what was expected, what was found, and how to fix it.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from fuseflow.data._errors import DatasetError

__all__ = ["read_idx", "read_split"]

# IDX type code -> (big-endian) NumPy dtype.
_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
           0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_GZIP_MAGIC = b"\x1f\x8b"
#: The most dimensions a header may declare: NumPy 1's array limit (NumPy 2 allows 64);
#: MNIST-style files have 1 to 3.
MAX_NDIM = 32
# The fix for a damaged file, by where it came from: only fuseflow's own cache is
# downloaded again; a file in a user's folder (data_dir, FUSEFLOW_DATA, idx_dataset, or a
# path given to read_idx) has to be restored from wherever the user got it.
_RESTORE = ("Fix: the file is damaged, incomplete or not the right file; delete it and "
            "restore it from its source (download, copy or unpack it again). fuseflow never "
            "downloads into a folder you give it.")
_REFETCH = ("Fix: the file in fuseflow's cache is damaged or incomplete; delete it, and the "
            "next call downloads it again.")


def _fail(path, problem: str, fix: str = _RESTORE):
    raise DatasetError(f"{path}: {problem}. {fix}")


def _read_bytes(path: Path, damaged: str) -> bytes:
    data = path.read_bytes()
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # bad CRC, cut short, garbled stream
        _fail(path, f"is not a valid gzip stream ({type(e).__name__}: {e})", damaged)


def read_idx(path) -> np.ndarray:
    """The array stored in the IDX file ``path`` (.gz or raw), in native byte order.

    Raises ``DatasetError`` when the header is not IDX or the payload does not match it.
    """
    return _read_idx(Path(path), _RESTORE)


def _read_idx(path: Path, damaged: str) -> np.ndarray:
    """``read_idx``, with ``damaged`` as the fix for a damaged file (by where it came from)."""
    data = _read_bytes(path, damaged)
    if len(data) < 4:
        _fail(path, f"has {len(data)} bytes, too short for the 4-byte IDX header", damaged)
    if data[0] != 0 or data[1] != 0:
        _fail(path, f"is not an IDX file: it starts with bytes {data[:4].hex(' ')}, expected "
                    "00 00 <type code> <number of dims>", damaged)
    code, ndim = data[2], data[3]
    if code not in _DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in _DTYPES)
        _fail(path, f"has unknown IDX data type code 0x{code:02X} (expected one of {known})",
              damaged)
    if ndim == 0:
        _fail(path, "declares 0 dimensions; an IDX file has at least 1", damaged)
    if ndim > MAX_NDIM:
        _fail(path, f"declares {ndim} dimensions; an IDX file readable as an array has 1 to "
                    f"{MAX_NDIM} (MNIST-style files 1 to 3), so the header is damaged", damaged)
    header = 4 + 4 * ndim
    if len(data) < header:
        _fail(path, f"is truncated inside its header: {ndim} dims need {header} bytes, "
                    f"the file has {len(data)}", damaged)
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = _DTYPES[code]
    count = math.prod(dims)  # a Python int: dims from a bad header cannot overflow
    want, have = count * dtype.itemsize, len(data) - header
    if have < want:
        _fail(path, f"is truncated: dims {dims} of {dtype.name} need {want} payload bytes, "
                    f"found {have}", damaged)
    if have > want:
        _fail(path, f"has {have - want} unexpected bytes after the payload of dims {dims} "
                    f"({want} bytes)", damaged)
    arr = np.frombuffer(data, dtype, count=count, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_split(images_path, labels_path, num_classes: int | None = 10, *,
               cached: bool = False, classes_from: str | None = None):
    """``(images, labels)`` as stored: uint8 (N, rows, cols) and uint8 (N,), checked as a pair.

    ``cached``: the files are fuseflow's download cache, so the fix for a damaged one is to
    delete it (the next call downloads it again); otherwise they are the user's, to be
    restored from their source. ``classes_from``: the call whose ``num_classes`` argument
    set the range of the labels (e.g. ``"ff.data.idx_dataset"``), which the fix for a label
    out of range then names; None: the number of classes is fixed (MNIST's 10).

    Parsed arrays are cached per file (path, size and modification time), and are read-only,
    so callers convert rather than modify them.
    """
    stamps = tuple((str(Path(p).resolve()), _stamp(p)) for p in (images_path, labels_path))
    return _read_split_cached(stamps, num_classes, cached, classes_from)


def _stamp(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _read_split_cached(stamps, num_classes, cached, classes_from):
    (images_path, _), (labels_path, _) = stamps
    damaged = _REFETCH if cached else _RESTORE
    images, labels = (_read_idx(Path(p), damaged) for p in (images_path, labels_path))
    if images.ndim == 1 or labels.ndim > 1:
        swapped = "Fix: check that the images and labels files are the right ones (not swapped)."
    else:  # a data set of one's own in another layout: say what is read
        swapped = ("Fix: fuseflow reads MNIST's layout, images uint8 (count, rows, cols) and "
                   "labels uint8 (count,); convert yours to it (e.g. floats in [0, 1] as "
                   "np.round(x * 255).astype(np.uint8)), or load them yourself as arrays "
                   "(docs/getting-started.md).")
    if images.ndim != 3 or images.dtype != np.uint8:
        _fail(images_path, f"should hold images, uint8 of shape (count, rows, cols); found "
                           f"{images.dtype} of shape {images.shape}", swapped)
    if labels.ndim != 1 or labels.dtype != np.uint8:
        _fail(labels_path, f"should hold labels, uint8 of shape (count,); found "
                           f"{labels.dtype} of shape {labels.shape}", swapped)
    if len(images) == 0 or 0 in images.shape[1:]:
        _fail(images_path, f"holds no image data: dims {images.shape} (count, rows, cols); a "
                           "split needs at least one image of at least 1x1 pixels", damaged)
    if len(images) != len(labels):
        _fail(labels_path, f"holds {len(labels)} labels but {images_path} holds "
                           f"{len(images)} images; the two must match", damaged)
    if num_classes is not None and len(labels) and int(labels.max()) >= num_classes:
        bad = int(np.argmax(labels >= num_classes))
        fix = damaged
        if classes_from is not None:
            fix = (f"Fix: if the data set has more than {num_classes} classes, pass "
                   f"{classes_from}(..., num_classes={int(labels.max()) + 1}) (its number of "
                   "classes), or num_classes=None to leave the labels unchecked; if it has "
                   f"{num_classes}, the labels file is damaged or not the right file: restore "
                   "it from its source.")
        _fail(labels_path, f"label {int(labels[bad])} at index {bad} is out of range "
                           f"0..{num_classes - 1} (num_classes={num_classes})", fix)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels
