"""``fuseflow train``/``eval`` with bad input and with folders that hold earlier runs.

The project's rule, checked here case by case: bad input gets one line
(``fuseflow train: error: ...``) that names the thing, what was expected, what was found and
the fix, with exit code 1 (2 for a malformed command line) and no traceback; and nothing a
user saved is lost or half-written (the files are compared byte for byte). Runs use
scikit-learn's digits, or small IDX folders written here, to stay fast.
"""

from __future__ import annotations

import gzip
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import train as T
from fuseflow.cli import main

SMALL = ["--hidden", "16", "--batch-size", "64", "--lr", "0.01", "--no-progress"]
DIGITS = ["--dataset", "digits", *SMALL]
IDX_NAMES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
             "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys):
    """``cli(*args)`` runs ``fuseflow *args`` in this process."""
    def call(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return Result(code, out, err)
    return call


def assert_one_line_error(proc, *says, command="train", code=1):
    """Exit ``code``, no traceback, and stderr is exactly one error line holding ``says``."""
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"fuseflow {command}: error: ")]
    assert len(errors) == 1, proc.stderr
    for text in says:
        assert text in errors[0], errors[0]
    return errors[0]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_idx(path: Path, arr: np.ndarray):
    header = bytes([0, 0, 0x08, arr.ndim]) + np.array(arr.shape, ">u4").tobytes()
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def idx_folder(folder: Path, test_images=None, test_labels=None, train_labels=None) -> Path:
    """The four MNIST-named IDX files holding digits (8x8); any of three arrays replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split in ("train", "test"):
        x, y = ff.data.digits(split)
        arrays[split] = [np.round(x * 255).astype(np.uint8).reshape(-1, 8, 8),
                         y.astype(np.uint8)]
    if test_images is not None:
        arrays["test"][0] = test_images
    if test_labels is not None:
        arrays["test"][1] = test_labels
    if train_labels is not None:
        arrays["train"][1] = train_labels
    for split, (images, labels) in arrays.items():
        write_idx(folder / IDX_NAMES[split][0], images)
        write_idx(folder / IDX_NAMES[split][1], labels)
    return folder


# ---------------------------------------------------------------- numbers that are not

@pytest.mark.parametrize("args, says", [
    (["--optimizer", "adamw", "--weight-decay", "nan"], "--weight-decay: expected a finite"),
    (["--optimizer", "adamw", "--weight-decay", "inf"], "--weight-decay: expected a finite"),
    (["--optimizer", "adamw", "--weight-decay", "-1"], "--weight-decay: expected a finite"),
    (["--lr", "inf"], "--lr: expected a positive finite float, got 'inf'"),
    (["--lr", "nan"], "--lr: expected a positive finite float, got 'nan'"),
])
def test_non_finite_lr_or_weight_decay_is_a_usage_error(tmp_path, args, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--dataset", "digits", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("field, value", [("lr", math.nan), ("lr", math.inf), ("lr", "0.1"),
                                          ("weight_decay", math.nan),
                                          ("weight_decay", math.inf), ("weight_decay", True)])
def test_recipe_rejects_non_finite_numbers(field, value):
    kwargs = dict(optimizer="adamw", weight_decay=1e-4)
    kwargs[field] = value
    with pytest.raises(T.RecipeError, match=rf"{field} must be a finite number.*Fix"):
        T.Recipe("digits", None, 64, 10, **kwargs)


# ------------------------------------------------------------------ data that disagrees

def test_test_images_of_another_size_are_named(tmp_path, cli):
    x, _ = ff.data.digits("test")
    bigger = np.zeros((len(x), 9, 9), np.uint8)
    folder = idx_folder(tmp_path / "idx", test_images=bigger)
    proc = cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o", *SMALL)
    assert_one_line_error(proc, str(folder / IDX_NAMES["test"][0]), "9x9 images (81 inputs)",
                          "training images", "8x8 images (64 inputs)", "Fix:")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_an_idx_file_with_no_examples_is_named(tmp_path, cli):
    folder = idx_folder(tmp_path / "idx", test_images=np.zeros((0, 8, 8), np.uint8),
                        test_labels=np.zeros(0, np.uint8))
    proc = cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o", *SMALL)
    assert_one_line_error(proc, str(folder / IDX_NAMES["test"][0]), "no image data",
                          "(0, 8, 8)", "Fix:")
    with pytest.raises(ff.data.DatasetError, match="no image data"):
        ff.data.idx_dataset(folder, "test")


def test_one_damaged_test_label_is_an_error_not_201_classes(tmp_path, cli):
    _, y = ff.data.digits("test")
    y = y.astype(np.uint8)
    y[7] = 200
    folder = idx_folder(tmp_path / "idx", test_labels=y)
    proc = cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o", *SMALL)
    assert_one_line_error(proc, str(folder / IDX_NAMES["test"][1]), "label 200 at index 7",
                          "outside the classes 0..9", str(folder / IDX_NAMES["train"][1]),
                          "Fix:")
    assert "201" not in proc.stdout


def test_a_damaged_training_label_leaves_a_gap_that_is_named(tmp_path, cli):
    _, y = ff.data.digits("train")
    y = y.astype(np.uint8)
    y[3] = 200
    folder = idx_folder(tmp_path / "idx", train_labels=y)
    proc = cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o", *SMALL)
    assert_one_line_error(proc, str(folder / IDX_NAMES["train"][1]), "up to 200",
                          "190 of the classes 0..200 have no training example (10..199)",
                          "label 200 (1 example, the first at index 3)", "Fix:")


def test_labels_checked_against_each_other_but_a_test_split_may_lack_a_class(tmp_path, cli):
    _, y = ff.data.digits("test")
    keep = y != 9  # no 9s in the test split: fine, the classes come from training
    x = np.round(ff.data.digits("test")[0][keep] * 255).astype(np.uint8).reshape(-1, 8, 8)
    folder = idx_folder(tmp_path / "idx", test_images=x, test_labels=y[keep].astype(np.uint8))
    ds = T.load_dataset("idx", folder)
    assert ds.classes == 10 and len(ds.test[1]) == keep.sum()


# ------------------------------------------------------------------------ fit's arguments

def _digits_fit_parts():
    recipe = T.Recipe("digits", None, 64, 10, hidden=(8,))
    model, opt = recipe.model(), recipe.optimizer_for(22)
    return model, opt, T.init_state(model, opt, (64,), ff.random.key(0))


def test_fit_checks_metadata_before_training(tmp_path):
    model, opt, state = _digits_fit_parts()
    steps = []
    with pytest.raises(TypeError, match=r"fit: metadata must be JSON-serialisable.*float32.*Fix"):
        T.fit(model, opt, state, ff.data.digits("train"), epochs=1, batch_size=64,
              out_dir=tmp_path / "o", metadata={"a": np.float32(1)}, progress=False, log=None,
              on_step=lambda s, m: steps.append(1))
    assert steps == [] and not (tmp_path / "o").exists()  # failed before any step or file


@pytest.mark.parametrize("epochs, fix", [(1.0, "epochs=1"), ("2", "epochs=2"), (True, "")])
def test_fit_wants_an_int_number_of_epochs(epochs, fix):
    model, opt, state = _digits_fit_parts()
    with pytest.raises(TypeError, match="fit: epochs must be an int") as info:
        T.fit(model, opt, state, ff.data.digits("train"), epochs=epochs, batch_size=64,
              progress=False, log=None)
    assert fix in str(info.value) and "already completed" not in str(info.value)


# ------------------------------------------------------------------- metrics.jsonl read

def test_a_torn_last_metrics_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / T.METRICS_FILE
    path.write_text('{"epoch": 1, "step": 22}\n{"epoch": 2, "st')
    with pytest.warns(RuntimeWarning, match=r"metrics.jsonl:2: the last line is cut short"):
        assert T.read_metrics(path) == [{"epoch": 1, "step": 22}]


@pytest.mark.parametrize("text, line", [('{"epoch": 1}\ngarbage\n{"epoch": 2}\n', 2),
                                        ('{"epoch": 1\n{"epoch": 2}\n', 1),
                                        ('{"epoch": 1}\n[1, 2]\n', 2)])
def test_a_damaged_metrics_line_elsewhere_is_an_error_naming_it(tmp_path, text, line):
    path = tmp_path / T.METRICS_FILE
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"metrics.jsonl:{line}: expected one JSON object "
                                         r"per line, got .*Fix"):
        T.read_metrics(path)
