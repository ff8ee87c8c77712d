"""Shared test options and fixtures.

``mnist_dir``: the folder holding the real MNIST IDX files, from ``--data-dir`` (the folder
with the files or one holding ``mnist/``), else ``$FUSEFLOW_DATA/mnist``, else
``../shared/data/mnist`` beside the repository. Tests that use it are skipped, with the
places tried, when none holds the files; they never download.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent.parent
_MARKER = "train-images-idx3-ubyte"


def pytest_addoption(parser):
    parser.addoption("--data-dir", default=None,
                     help="folder with the MNIST IDX files, or holding mnist/ "
                          "(default: $FUSEFLOW_DATA, else ../shared/data)")


def _holds_mnist(folder: Path) -> bool:
    return any((folder / n).is_file() for n in (_MARKER, _MARKER + ".gz"))


@pytest.fixture(scope="session")
def mnist_dir(request) -> Path:
    option = request.config.getoption("--data-dir")
    env = os.environ.get("FUSEFLOW_DATA")
    root = option or env or _REPO.parent / "shared" / "data"
    tried = [Path(root), Path(root) / "mnist"]
    for folder in tried:
        if _holds_mnist(folder):
            return folder
    source = "--data-dir" if option else "FUSEFLOW_DATA" if env else "the default"
    pytest.skip(f"real MNIST not found ({source}: looked in {', '.join(map(str, tried))}); "
                "pass --data-dir or set FUSEFLOW_DATA to a folder holding mnist/")
