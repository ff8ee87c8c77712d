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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import train as T
from fuseflow.cli import main

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--hidden", "16", "--batch-size", "64", "--lr", "0.01", "--no-progress"]
DIGITS = ["--dataset", "digits", *SMALL]
IDX_NAMES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
             "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


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
    assert not (tmp_path / "o").exists()  # the folder made for the run is gone again


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


# -------------------------------------------------------- runs already in the output folder

@pytest.fixture(scope="module")
def run3(tmp_path_factory):
    """A 3-epoch digits run, copied by each test that changes it."""
    out = tmp_path_factory.mktemp("run3") / "run"
    assert main(["train", *DIGITS, "--epochs", "3", "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(run3, tmp_path):
    """A copy of the 3-epoch run, and its files' hashes as they are now."""
    out = tmp_path / "run"
    shutil.copytree(run3, out)
    return out, snapshot(out)


def test_resuming_an_earlier_epoch_in_place_keeps_the_later_ones(run, cli):
    out, before = run
    proc = cli("train", "--resume", out / "ckpt-epoch1.safetensors", "--epochs", "200",
               "--no-progress")
    assert_one_line_error(proc, "continues the run after epoch 1",
                          "ckpt-epoch2.safetensors, ckpt-epoch3.safetensors, last.safetensors",
                          "Fix: --out NEW_DIR", f"--resume {out / T.LAST}", "--overwrite")
    assert snapshot(out) == before


def test_resuming_the_latest_checkpoint_in_place_continues(run, cli):
    out, before = run
    proc = cli("train", "--resume", out / T.LAST, "--epochs", "4", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    after = snapshot(out)
    for name in ("ckpt-epoch1.safetensors", "ckpt-epoch2.safetensors",
                 "ckpt-epoch3.safetensors"):
        assert after[name] == before[name]
    assert [r["epoch"] for r in T.read_metrics(out / T.METRICS_FILE)] == [1, 2, 3, 4]


def test_a_checkpoint_newer_than_last_is_protected_and_suggested(run, cli):
    out, _ = run
    # as a kill between writing ckpt-epoch3 and last.safetensors leaves the folder
    (out / T.LAST).write_bytes((out / "ckpt-epoch2.safetensors").read_bytes())
    before = snapshot(out)
    proc = cli("train", "--resume", out / T.LAST, "--no-progress")
    assert_one_line_error(proc, "after epoch 2", "ckpt-epoch3.safetensors",
                          f"--resume {out / 'ckpt-epoch3.safetensors'}")
    assert snapshot(out) == before


@pytest.mark.parametrize("name", ["ckpt-epoch3.safetensors", T.LAST, T.METRICS_FILE,
                                  "curves.png"])
def test_a_new_run_never_replaces_any_run_file(run, tmp_path, cli, name):
    out, _ = run
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / name).write_bytes((out / name).read_bytes())
    before = snapshot(lone)
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", lone)
    assert_one_line_error(proc, f"{lone} already holds a run ({name})", "--overwrite",
                          "--out NEW_DIR")
    assert snapshot(lone) == before


def test_resuming_into_another_runs_folder_is_refused(run, run3, cli):
    out, before = run
    proc = cli("train", "--resume", run3 / "ckpt-epoch1.safetensors", "--out", out,
               "--no-progress")
    assert_one_line_error(proc, f"{out} already holds a run", "--overwrite")
    assert snapshot(out) == before


def test_overwrite_replaces_the_old_run_once_the_new_one_has_an_epoch(run, cli):
    out, before = run
    proc = cli("train", *DIGITS, "--epochs", "2", "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert "moved to" in proc.stdout and proc.stdout.splitlines()[-1].startswith("test_acc")
    assert sorted(p.name for p in out.iterdir()) == [
        "ckpt-epoch1.safetensors", "ckpt-epoch2.safetensors", "curves.png",
        "last.safetensors", "metrics.jsonl"]  # the old epoch 3 is gone, no backup is left
    assert [r["epoch"] for r in T.read_metrics(out / T.METRICS_FILE)] == [1, 2]
    assert snapshot(out)["ckpt-epoch1.safetensors"] != before["ckpt-epoch1.safetensors"]


def _stopped_fit(error):
    """The real fit, stopped by ``error`` at its first step, before any epoch is saved."""
    real = T.fit

    def fit(*args, **kwargs):
        def stop(state, metrics):
            raise error
        return real(*args, on_step=stop, **kwargs)
    return fit


@pytest.mark.parametrize("signum, code, said", [(signal.SIGINT, 130, "interrupted: "),
                                                (signal.SIGTERM, 143, "terminated (SIGTERM): ")])
@pytest.mark.parametrize("resume", [False, True])
def test_overwrite_puts_the_old_files_back_when_stopped_before_an_epoch(run, cli, monkeypatch,
                                                                        resume, signum, code,
                                                                        said):
    out, before = run
    monkeypatch.setattr("fuseflow.cli.fit", _stopped_fit(T.Interrupted(None, 0, signum)))
    args = (["--resume", out / "ckpt-epoch1.safetensors", "--no-progress"] if resume else
            [*DIGITS, "--epochs", "2", "--out", out])
    proc = cli("train", *args, "--overwrite")
    assert proc.returncode == code, proc.stderr
    assert "the replaced files are back" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith(said)
    assert snapshot(out) == before  # every byte, and no backup folder left
    if resume:  # the command it prints continues: the later epochs are back, so it asks
        assert proc.stdout.splitlines()[-1].endswith(  # for --overwrite again
            f"continue with: fuseflow train --resume {out / 'ckpt-epoch1.safetensors'} "
            "--overwrite")


def test_sigterm_before_training_starts_still_puts_the_old_files_back(run, cli, monkeypatch):
    """SIGTERM between setting the old files aside and fit's loop (data on the device, label
    checks) takes the same clean way out as Ctrl-C: files back, exit 143."""
    out, before = run
    real = T.fit

    def fit(*args, **kwargs):
        # if the command had not taken SIGTERM over, the kill below would end pytest itself
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr("fuseflow.cli.fit", fit)
    proc = cli("train", *DIGITS, "--epochs", "2", "--out", out, "--overwrite")
    assert proc.returncode == 143, proc.stderr
    assert "the replaced files are back" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "terminated (SIGTERM): no checkpoint written"
    assert snapshot(out) == before
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_a_resume_whose_folder_holds_other_checkpoints_is_refused(run, cli):
    """The checkpoint renamed, its epoch's file gone: the folder's other files are not
    the resumed run's (as far as can be told), and nothing is replaced without asking."""
    out, _ = run
    os.replace(out / "ckpt-epoch3.safetensors", out / "final.safetensors")
    (out / "last.safetensors").unlink()
    before = snapshot(out)
    proc = cli("train", "--epochs", "4", "--resume", out / "final.safetensors",
               "--no-progress")
    assert_one_line_error(proc, "ckpt-epoch1.safetensors, ckpt-epoch2.safetensors",
                          "not the checkpoints of the run --resume continues",
                          "Fix: --out NEW_DIR, or --overwrite")
    assert snapshot(out) == before


def test_a_resume_into_a_new_folder_stopped_early_says_how_to_go_on(run, cli, monkeypatch,
                                                                    tmp_path):
    out, _ = run
    monkeypatch.setattr("fuseflow.cli.fit", _stopped_fit(T.Interrupted(None, 1)))
    new = tmp_path / "new"
    proc = cli("train", "--epochs", "3", "--resume", out / "ckpt-epoch1.safetensors",
               "--out", new, "--no-progress")
    assert proc.returncode == 130
    assert proc.stdout.splitlines()[-1].endswith(
        f"continue with: fuseflow train --resume {out / 'ckpt-epoch1.safetensors'} --out {new}")
    assert not new.exists()  # made by the command, left empty, removed


def test_a_signal_during_the_final_clean_up_changes_nothing(run, cli, monkeypatch):
    """Ctrl-C while --overwrite deletes the old files after a finished run: the clean-up
    completes and the run reports its result."""
    out, _ = run
    from fuseflow.train import _run_folder

    close = _run_folder.RunFolder.close

    def close_with_ctrl_c(self):
        os.kill(os.getpid(), signal.SIGINT)
        return close(self)

    monkeypatch.setattr(_run_folder.RunFolder, "close", close_with_ctrl_c)
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("test_accuracy=")
    assert not list(out.glob("replaced-*"))


def test_overwrite_puts_the_old_files_back_after_an_error(run, cli, monkeypatch):
    out, before = run
    monkeypatch.setattr("fuseflow.cli.fit", _stopped_fit(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli("train", *DIGITS, "--epochs", "2", "--out", out, "--overwrite")
    assert snapshot(out) == before


def test_overwrite_in_place_keeps_the_epochs_before_the_checkpoint(run, run3, cli):
    out, before = run
    proc = cli("train", "--resume", out / "ckpt-epoch1.safetensors", "--overwrite",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    after = snapshot(out)
    assert after["ckpt-epoch1.safetensors"] == before["ckpt-epoch1.safetensors"]
    assert sorted(after) == sorted(before)  # the same files, and no backup folder
    old, new = T.read_metrics(run3 / T.METRICS_FILE), T.read_metrics(out / T.METRICS_FILE)
    assert new[0] == old[0]  # epoch 1's record is the original one
    # epochs 2 and 3 trained again from the checkpoint: the same results (bit for bit)
    assert [(r["epoch"], r["train_loss"], r["test_acc"]) for r in new] == \
        [(r["epoch"], r["train_loss"], r["test_acc"]) for r in old]


def test_a_killed_overwrite_leaves_the_old_run_in_the_backup(run, cli):
    out, before = run
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuseflow", "train", "--dataset", "digits", "--hidden",
         "2048,2048", "--epochs", "3", "--out", str(out), "--overwrite", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(
            os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])))
    deadline = time.monotonic() + 120
    try:
        while not list(out.glob("replaced-*/curves.png")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    backup = next(out.glob("replaced-*"))
    assert snapshot(backup) == before  # the old run, whole, where the message said
    for path in out.iterdir():  # what the killed run began, cleaned up by the user
        if path.is_file():
            path.unlink()
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", out)
    assert proc.returncode == 0 and f"note: {backup} holds files an earlier --overwrite" \
        in proc.stdout
    assert snapshot(backup) == before  # a later run leaves it alone


# ---------------------------------------------------------------- one line, not a traceback

def test_out_that_is_a_file_is_named_before_any_work(tmp_path, cli):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", afile)
    assert_one_line_error(proc, f"--out {afile} is a file", "Fix: --out a folder")
    assert "data:" not in proc.stdout  # refused before the data was loaded
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", afile / "sub")
    assert_one_line_error(proc, f"--out {afile / 'sub'}: {afile} is a file", "Fix:")
    assert afile.read_text() == "mine"


def test_out_that_cannot_be_written_is_named(tmp_path, cli, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.access(locked, os.W_OK):  # root writes anywhere: make the write fail instead
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    try:
        proc = cli("train", *DIGITS, "--epochs", "1", "--out", locked)
        assert_one_line_error(proc, f"--out {locked}: cannot write in this folder",
                              "Permission denied", "Fix:")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_a_new_out_folder_is_removed_again_when_the_run_fails_before_an_epoch(tmp_path, cli):
    _, y = ff.data.digits("test")
    y = y.astype(np.uint8)
    y[0] = 99
    folder = idx_folder(tmp_path / "idx", test_labels=y)
    proc = cli("train", "--data-dir", folder, "--out", tmp_path / "new" / "run", *SMALL)
    assert_one_line_error(proc, "label 99 at index 0")
    assert not (tmp_path / "new").exists()


def test_a_damaged_metrics_line_on_resume_is_one_line_and_changes_nothing(run, cli):
    out, _ = run
    lines = (out / T.METRICS_FILE).read_text().splitlines(keepends=True)
    (out / T.METRICS_FILE).write_text(lines[0] + '{"epoch": 2, "st\n' + lines[2])
    before = snapshot(out)
    proc = cli("train", "--resume", out / T.LAST, "--epochs", "4", "--no-progress")
    assert_one_line_error(proc, f"{out / T.METRICS_FILE}:2: expected one JSON object", "Fix:")
    assert snapshot(out) == before


def test_a_torn_metrics_line_on_resume_is_a_warning_and_the_run_continues(run, cli):
    out, _ = run
    with open(out / T.METRICS_FILE, "a") as f:
        f.write('{"epoch": 4, "st')  # a crash in the middle of appending epoch 4
    proc = cli("train", "--resume", out / T.LAST, "--epochs", "4", "--no-progress")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    warning = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith("fuseflow train: warning: ")
    assert "last line is cut short" in warning[0]
    assert [r["epoch"] for r in T.read_metrics(out / T.METRICS_FILE)] == [1, 2, 3, 4]


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_folder_given_as_the_checkpoint_suggests_its_last_file(run, cli, command):
    out, before = run
    proc = cli(command, "--resume", out) if command == "train" else cli("eval", out)
    option = "--resume" if command == "train" else "CKPT"
    assert_one_line_error(proc, f"{option} {out} is a folder", f"Fix: {option} {out / T.LAST}",
                          command=command)
    assert snapshot(out) == before


@pytest.mark.parametrize("args", [["train", *DIGITS],
                                  ["train", "--resume", "{run}/last.safetensors"],
                                  ["eval", "{run}/last.safetensors"]])
def test_data_dir_with_digits_is_an_error_not_ignored(run, tmp_path, cli, args):
    out, before = run
    args = [a.format(run=out) for a in args]
    proc = cli(*args, "--data-dir", tmp_path / "nowhere", "--out", tmp_path / "o") \
        if args[0] == "train" else cli(*args, "--data-dir", tmp_path / "nowhere")
    assert_one_line_error(proc, f"--data-dir {tmp_path / 'nowhere'}", "digits",
                          "Fix: drop --data-dir", command=args[0])
    assert snapshot(out) == before and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="does not apply to the digits"):
        T.load_dataset("digits", tmp_path)


def test_an_absurd_hidden_width_is_one_line(tmp_path, cli):
    proc = cli("train", "--dataset", "digits", "--hidden", "99999999999", "--out",
               tmp_path / "o", "--no-progress")
    assert_one_line_error(proc, "--hidden 99999999999", "parameters", "Fix: smaller --hidden")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, names, fix", [
    (["--hidden", "1", "--input-width", "10000000000"], "--input-width 10000000000",
     "Fix: a smaller --input-width."),
    (["--classes", "10000000000"], "--classes 10000000000", "Fix: fewer --classes."),
    (["--hidden", "99999999999"], "--hidden 99999999999", "Fix: smaller --hidden widths"),
])
def test_bench_names_the_option_that_makes_the_model_too_large(cli, args, names, fix):
    proc = cli("bench", *args)
    assert_one_line_error(proc, names, "parameters", fix, command="bench")


def test_running_out_of_memory_is_one_line(tmp_path, cli, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 3.0 GiB")
    monkeypatch.setattr("fuseflow.cli.init_state", no_memory)
    proc = cli("train", *DIGITS, "--out", tmp_path / "o")
    assert_one_line_error(proc, "--hidden 16", "do not fit in memory", "Unable to allocate",
                          "Fix:")


def test_eval_names_a_damaged_test_label(tmp_path, cli):
    folder = idx_folder(tmp_path / "idx")
    assert cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o",
               *SMALL).returncode == 0
    _, y = ff.data.digits("test")
    y = y.astype(np.uint8)
    y[5] = 200
    write_idx(folder / IDX_NAMES["test"][1], y)
    proc = cli("eval", tmp_path / "o" / T.LAST)
    assert_one_line_error(proc, str(folder / IDX_NAMES["test"][1]), "label 200 at index 5",
                          "outside the checkpoint's 10 classes", "Fix:", command="eval")


def test_eval_says_when_the_runs_data_folder_has_moved(tmp_path, cli):
    folder = idx_folder(tmp_path / "idx")
    assert cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o",
               *SMALL).returncode == 0
    folder.rename(tmp_path / "moved")
    proc = cli("eval", tmp_path / "o" / T.LAST)
    line = assert_one_line_error(proc, "the checkpoint's run read its data from", str(folder),
                                 "which no longer holds its test split", "Fix: --data-dir DIR",
                                 command="eval")
    assert line.count("Fix:") == 1
    assert cli("eval", tmp_path / "o" / T.LAST, "--data-dir", tmp_path / "moved").returncode == 0


def test_a_resume_says_when_the_runs_data_folder_has_moved(tmp_path, cli):
    """As eval: the folder the checkpoint recorded is named, and the fix is --data-dir."""
    folder = idx_folder(tmp_path / "idx")
    assert cli("train", "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "o",
               *SMALL).returncode == 0
    folder.rename(tmp_path / "moved")
    before = snapshot(tmp_path / "o")
    ckpt = tmp_path / "o" / T.LAST
    proc = cli("train", "--resume", ckpt, "--epochs", "2", "--no-progress")
    line = assert_one_line_error(proc, "the checkpoint's run read its data from", str(folder),
                                 "which no longer holds the data set",
                                 f"Fix: --resume {ckpt} --data-dir DIR")
    assert line.count("Fix:") == 1 and snapshot(tmp_path / "o") == before
    assert cli("train", "--resume", ckpt, "--epochs", "2", "--data-dir", tmp_path / "moved",
               "--no-progress").returncode == 0


def test_a_torn_metrics_line_resumed_into_a_new_folder_is_a_warning(run, cli, tmp_path):
    """Resumed elsewhere, the cut-short line is dropped with the warning the docs promise,
    once."""
    out, _ = run
    with open(out / T.METRICS_FILE, "a") as f:
        f.write('{"epoch": 4, "st')
    proc = cli("train", "--resume", out / T.LAST, "--epochs", "4", "--out", tmp_path / "new",
               "--no-progress")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    warning = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "last line is cut short" in warning[0], proc.stderr
    assert [r["epoch"] for r in T.read_metrics(tmp_path / "new")] == [1, 2, 3, 4]


@pytest.mark.parametrize("which", ["data", "checkpoint"])
def test_a_file_that_cannot_be_read_is_one_line(run, tmp_path, cli, monkeypatch, which):
    """A data file or checkpoint without read permission: named, with the fix, not a
    traceback (safetensors alone calls it a missing file)."""
    out, before = run
    folder = idx_folder(tmp_path / "idx")
    target = folder / IDX_NAMES["train"][0] if which == "data" else out / T.LAST
    target.chmod(0o000)
    if os.access(target, os.R_OK):  # root reads anything: refuse the read instead
        real_open = open

        def refuse(path, *args, **kwargs):
            if Path(path) == target:
                raise PermissionError(13, "Permission denied", str(target))
            return real_open(path, *args, **kwargs)
        monkeypatch.setattr("builtins.open", refuse)
        monkeypatch.setattr(Path, "read_bytes", lambda p: refuse(p, "rb").read())
    try:
        commands = ([["train", "--data-dir", folder, "--out", tmp_path / "o", *SMALL]]
                    if which == "data" else
                    [["train", "--resume", target, "--epochs", "4", "--out", tmp_path / "o",
                      "--no-progress"], ["eval", target]])
        for args in commands:
            proc = cli(*args)
            assert_one_line_error(proc, f"cannot open {target} (Permission denied)",
                                  "Fix: make it readable", command=args[0])
    finally:
        target.chmod(0o644)
        monkeypatch.undo()
    assert snapshot(out) == before and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [["train", *DIGITS, "--resume", ""],
                                  ["train", *DIGITS, "--out", " "],
                                  ["train", "--data-dir", "", "--no-progress"],
                                  ["eval", ""]])
def test_an_empty_path_is_a_usage_error_not_a_default(args, tmp_path, capsys, monkeypatch):
    """``--resume "$CKPT"`` with CKPT unset would otherwise start a fresh run."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert "expected a path, got" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
