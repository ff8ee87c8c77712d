"""Usability audit: a wrong ``data_dir`` is an error (never other data), a folder given to
checkpoint.save/load is named plainly, and every loss shape error says the fix.

No test touches the network: the only mirror is a file:// folder in tmp_path.
"""

import hashlib
import re

import numpy as np
import pytest

import fuseflow as ff
import fuseflow.data as ffd
from fuseflow.data import _mnist
from fuseflow.losses import LossError
from tests.test_data import _NAMES, fake_mnist


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """MNIST-named files in FUSEFLOW_DATA, in the cache and on a (file://) mirror: all the
    places a wrong data_dir used to be quietly replaced by."""
    fake_mnist(tmp_path / "env" / "mnist", n=4)
    monkeypatch.setenv("FUSEFLOW_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fake_mnist(_mnist.cache_dir(), n=5)
    mirror = fake_mnist(tmp_path / "mirror", n=6)
    monkeypatch.setattr(_mnist, "MIRRORS", (mirror.as_uri() + "/",))
    monkeypatch.setattr(_mnist, "SHA256", {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                           for p in mirror.iterdir()})
    return tmp_path


# ---------------------------------------------------------------- finding 1: data_dir

def test_wrong_data_dir_is_an_error_not_mnist_from_elsewhere(elsewhere):
    wrong = elsewhere / "fashion_mnist"
    with pytest.raises(ffd.DatasetNotFoundError) as err:
        ffd.mnist("test", wrong, download=False)
    msg = str(err.value)
    assert f"not found in data_dir={str(wrong)!r}" in msg
    assert f"{wrong} (data_dir=, no such folder)" in msg
    assert "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]" in msg
    assert "only place looked" in msg and "Fix: pass the folder that holds these files" in msg
    assert str(elsewhere / "env") not in msg  # FUSEFLOW_DATA was not looked in


def test_wrong_data_dir_never_downloads(elsewhere):
    cached = sorted(p.name for p in _mnist.cache_dir().iterdir())
    (elsewhere / "empty").mkdir()
    with pytest.raises(ffd.DatasetNotFoundError, match="nothing is downloaded"):
        ffd.mnist("train", elsewhere / "empty")  # download=True
    assert sorted(p.name for p in _mnist.cache_dir().iterdir()) == cached


def test_right_data_dir_still_wins(elsewhere):
    fake_mnist(elsewhere / "mine", n=3)
    assert len(ffd.mnist("test", elsewhere / "mine")[1]) == 3
    assert len(ffd.mnist("test", elsewhere / "env")[1]) == 4  # a folder holding mnist/


def test_data_dir_that_is_a_file_is_called_a_file(elsewhere):
    file = elsewhere / "env" / "mnist" / (_NAMES["test"][0] + ".gz")
    with pytest.raises(ffd.DatasetNotFoundError,
                       match=re.escape(f"{file} (data_dir=, a file, not a folder)")):
        ffd.mnist("test", file)
    with pytest.raises(ffd.DatasetNotFoundError,
                       match=re.escape(f"{file} (a file, not a folder) does not hold the test")):
        ffd.idx_dataset(file, "test")


# ------------------------------------------------------------ finding 2: checkpoint paths

def test_save_to_a_folder_is_refused_before_writing(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(IsADirectoryError) as err:
        ff.checkpoint.save(runs, {"w": np.ones(2)})
    msg = str(err.value)
    assert msg.startswith(f"checkpoint.save: '{runs}' is a folder")
    assert f"Fix: give a file path such as {runs / 'model.safetensors'}" in msg
    assert ".tmp" not in msg
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["runs"]  # no temporary file left


def test_load_of_a_folder_or_missing_file_names_the_path(tmp_path):
    ff.checkpoint.save(tmp_path / "a.safetensors", {"w": np.ones(2)})
    with pytest.raises(IsADirectoryError,
                       match=re.escape(f"checkpoint.load: '{tmp_path}' is a folder") + ".*"
                             + re.escape(f"Fix: give a file path such as {tmp_path}/model.")):
        ff.checkpoint.load(tmp_path)
    missing = tmp_path / "b.safetensors"
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f"checkpoint.load: '{missing}' does not exist (its "
                                       "folder holds a.safetensors). Fix: check the path")):
        ff.checkpoint.load(missing)
    with pytest.raises(FileNotFoundError, match="checkpoint.read_metadata: .* does not exist "
                                                "\\(no checkpoint beside it\\)"):
        ff.checkpoint.read_metadata(tmp_path / "nowhere" / "c.safetensors")


# --------------------------------------------------------------- finding 3: loss messages

def test_mse_shape_error_says_the_fix():
    with pytest.raises(LossError, match=r"mse: targets must have the outputs' shape \(8, 10\), "
                                        r"got \(8,\)\. Fix: .*softmax_cross_entropy.*"
                                        r"np\.eye\(10, dtype=np\.float32\)\[labels\]"):
        ff.losses.mse(np.zeros((8, 10), np.float32), np.zeros(8, np.int64))


@pytest.mark.parametrize("call", [
    lambda: ff.losses.mse(np.zeros((8, 10), np.float32), [0.0] * 8),
    lambda: ff.losses.sigmoid_binary_cross_entropy(np.zeros((8, 1), np.float32), np.zeros(8)),
    lambda: ff.losses.softmax_cross_entropy(np.zeros(10, np.float32), np.zeros(1, np.int64)),
    lambda: ff.losses.accuracy(np.zeros(10, np.float32), np.zeros(1, np.int64)),
], ids=["mse-list", "bce-shape", "softmax-1d", "accuracy-1d"])
def test_every_loss_shape_error_says_the_fix(call):
    with pytest.raises(LossError, match=r"\. Fix: \S"):
        call()


def test_a_failed_download_leaves_no_empty_cache_folder(tmp_path):
    from fuseflow.data._download import fetch

    folder = tmp_path / "cache" / "fuseflow" / "mnist"
    with pytest.raises(OSError, match="could not download"):
        fetch("train-labels-idx1-ubyte.gz", folder, [(tmp_path / "no-mirror").as_uri()],
              "0" * 64, timeout=1)
    assert not (tmp_path / "cache").exists()  # nor the folders made above it


def test_mse_fix_fits_the_targets(rng):
    out = rng.standard_normal((8, 1)).astype(np.float32)
    with pytest.raises(ff.losses.LossError, match=r"Fix: targets.reshape\(-1, 1\)"):
        ff.losses.mse(out, rng.standard_normal(8).astype(np.float32))
    with pytest.raises(ff.losses.LossError, match=r"one-hot encode them: np.eye\(10"):
        ff.losses.mse(rng.standard_normal((8, 10)).astype(np.float32), rng.integers(0, 10, 8))
