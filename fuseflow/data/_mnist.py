"""MNIST and its look-alikes (Fashion-MNIST, KMNIST) from the four standard IDX files
(``train-images-idx3-ubyte``, raw or ``.gz``; the dotted ``train-images.idx3-ubyte`` that
many copies use works too).

Where the files come from: an explicit ``data_dir`` argument (the folder with the files, or
a folder holding ``mnist/``) is the only place looked; when it lacks them, that is an error,
never a quiet fallback to other files or a download (a wrong path, say a Fashion-MNIST
folder, must not train on MNIST). Without ``data_dir``, in order: the ``FUSEFLOW_DATA``
environment variable (a folder holding ``mnist/``; the files directly also work), then the
user cache (``$XDG_CACHE_HOME/fuseflow/mnist``, else ``~/.cache/fuseflow/mnist``). When they
are in neither, they are downloaded into the cache from the canonical mirrors and checked
against their published sha256.

Only the cache is checksummed on load: a user's folder may legitimately hold Fashion-MNIST
under the very same file names, and the structural checks of the IDX reader already catch
truncated or swapped files there.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fuseflow.data._download import fetch, sha256_file
from fuseflow.data._errors import DatasetError, DatasetNotFoundError
from fuseflow.data._idx import read_split

__all__ = ["MIRRORS", "SHA256", "cache_dir", "idx_dataset", "mnist"]

# split -> (images file, labels file), without the optional ".gz".
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
           "https://storage.googleapis.com/cvdf-datasets/mnist/")

SHA256 = {  # the published digests of the canonical .gz files
    "train-images-idx3-ubyte.gz":
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz":
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz":
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def cache_dir() -> Path:
    """The folder MNIST is downloaded into: ``$XDG_CACHE_HOME/fuseflow/mnist`` or
    ``~/.cache/fuseflow/mnist``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "fuseflow" / "mnist"


def _split_names(split: str):
    if split not in _FILES:
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
    return _FILES[split]


def _spellings(name: str):
    """A file's accepted names, in order of preference: the canonical one, its .gz, and the
    dotted form many copies use (``train-images.idx3-ubyte``, e.g. Kaggle's)."""
    dotted = name.replace("-idx", ".idx")
    return name, name + ".gz", dotted, dotted + ".gz"


def _wanted(names) -> str:
    """The split's files as the messages name them."""
    return (f"{names[0]}[.gz] and {names[1]}[.gz] (or {_spellings(names[0])[2]}, ... as "
            "many copies name them)")


def _find(folder: Path, names):
    """The split's two files in ``folder`` (a raw file wins over its .gz), or None."""
    found = []
    for name in names:
        hit = next((folder / n for n in _spellings(name) if (folder / n).is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return tuple(found)


def _not_a_folder(path: Path) -> str:
    """Why ``path`` cannot hold the files ("" when it is a folder), for the messages: a
    path to one of the files is an easy slip, and "no such folder" would hide it."""
    if path.is_dir():
        return ""
    return "a file, not a folder" if path.exists() else "no such folder"


def _as_arrays(images, labels):
    x = images.reshape(len(images), int(np.prod(images.shape[1:]))).astype(np.float32)
    x /= 255.0
    return x, labels.astype(np.int64)


def idx_dataset(folder, split: str = "train", *, num_classes: int | None = 10):
    """``(images, labels)`` from a folder holding the four IDX files under their MNIST names.

    For Fashion-MNIST, KMNIST and the like. Images come flattened, float32 (N, rows*cols)
    in [0, 1]; labels int64. Labels must lie in ``0..num_classes-1`` (None: unchecked).
    """
    names = _split_names(split)
    folder = Path(folder)
    files = _find(folder, names)
    if files is None:
        why = _not_a_folder(folder)
        raise DatasetNotFoundError(
            f"{folder}{f' ({why})' if why else ''} does not hold the {split} split: expected "
            f"{_wanted(names)} there. Fix: pass the folder that holds these files.")
    return _as_arrays(*read_split(*files, num_classes, classes_from="ff.data.idx_dataset"))


def _candidates(data_dir):
    """(folder, where it came from) in look-up order; an explicit data_dir is the only place."""
    if data_dir is not None:
        yield Path(data_dir), "data_dir="
        yield Path(data_dir) / "mnist", "data_dir="
        return
    env = os.environ.get("FUSEFLOW_DATA")
    if env:
        yield Path(env) / "mnist", "FUSEFLOW_DATA"
        yield Path(env), "FUSEFLOW_DATA"
    yield cache_dir(), "cache"


def _verify_cached(files):
    for path in files:
        want = SHA256.get(path.name)
        if want is not None and (got := sha256_file(path)) != want:
            raise DatasetError(
                f"{path}: sha256 is {got}, expected {want} (the canonical MNIST file). "
                f"Fix: delete {path}; the next call downloads it again.")


def _cached_or_fetch(name: str) -> Path:
    path = cache_dir() / name
    return path if path.is_file() else fetch(name, cache_dir(), MIRRORS, SHA256[name])


def mnist(split: str = "train", data_dir=None, *, download: bool = True):
    """Real MNIST: images float32 (N, 784) in [0, 1] and labels int64 (N,).

    ``split`` is "train" (60000) or "test" (10000). ``data_dir`` given: only that folder
    (or its ``mnist/``) is read, else DatasetNotFoundError. Without it, see the module
    docstring for where the files are looked for; with ``download=False`` nothing is fetched.
    """
    names = _split_names(split)
    looked = []
    for folder, origin in _candidates(data_dir):
        files = _find(folder, names)
        if files is None:
            why = _not_a_folder(folder)
            looked.append(f"{folder} ({origin}{', ' + why if why else ''})")
            continue
        if origin == "cache":
            _verify_cached(files)
        return _as_arrays(*read_split(*files, cached=origin == "cache"))
    wanted = _wanted(names)
    places = "".join(f"  - {line}\n" for line in looked)
    if data_dir is not None:
        raise DatasetNotFoundError(
            f"MNIST ({split} split) not found in data_dir={str(data_dir)!r}: looked for "
            f"{wanted} in\n{places}An explicit data_dir is the only place looked (nothing "
            "else is read, nothing is downloaded).\nFix: pass the folder that holds these "
            "files (or a folder holding mnist/), or leave data_dir out to use FUSEFLOW_DATA, "
            f"the cache ({cache_dir()}) or a download.")
    problem = "download=False"
    if download:
        try:
            files = tuple(_cached_or_fetch(n + ".gz") for n in names)
            _verify_cached(files)
            return _as_arrays(*read_split(*files, cached=True))
        except OSError as e:
            problem = str(e)
    raise DatasetNotFoundError(
        f"MNIST ({split} split) not found: looked for {wanted} in\n{places}"
        f"and did not download it ({problem}).\n"
        "Fix: point fuseflow at a folder holding the MNIST IDX files: "
        "mnist(data_dir='path/to/folder'), the environment variable FUSEFLOW_DATA (a folder "
        "holding mnist/), or `fuseflow train --data-dir path/to/folder`; or go online once so "
        f"the files download into {cache_dir()}.")
