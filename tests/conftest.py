"""Shared test options and fixtures.

``mnist_dir``: the folder holding the real MNIST IDX files, from ``--data-dir`` (the folder
with the files or one holding ``mnist/``), else ``$FUSEFLOW_DATA/mnist``, else
``../shared/data/mnist`` beside the repository. Tests that use it are skipped, with the
places tried, when none holds the files; they never download.

``rng``: a NumPy Generator with a fresh seed per test (``FUSEFLOW_TEST_SEED`` repeats one),
printed and kept as ``rng.seed`` for failure messages. ``cli``: runs ``fuseflow ARGS`` in
this process and returns its exit code, stdout and stderr. ``cp``: the CuPy module, for GPU
tests (skipped without a usable GPU).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np
import pytest

_REPO = Path(__file__).resolve().parent.parent
_MARKER = "train-images-idx3-ubyte"


def pytest_addoption(parser):
    parser.addoption("--data-dir", default=None,
                     help="folder with the MNIST IDX files, or holding mnist/ "
                          "(default: $FUSEFLOW_DATA, else ../shared/data)")


def _holds_mnist(folder: Path) -> bool:
    return any((folder / n).is_file() for n in (_MARKER, _MARKER + ".gz"))


@pytest.fixture(scope="module")
def cp():
    import fuseflow as ff

    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    return cupy


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


class _Rng:
    """A NumPy Generator that remembers its seed (for failure messages)."""

    def __init__(self, seed):
        self.seed = seed
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._g, name)


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FUSEFLOW_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"FUSEFLOW_TEST_SEED={seed}")  # shown with a failure's captured output
    return _Rng(seed)


class CliResult:
    """What ``fuseflow.cli.main`` did: exit code, stdout and stderr, shaped like a
    CompletedProcess."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys):
    """``cli(*args)`` runs ``fuseflow *args`` in this process."""
    from fuseflow.cli import main

    def call(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)
    return call
