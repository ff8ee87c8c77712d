"""What stops a run that cannot end well, with one line that says why and how to go on:
a second run given the same output folder, a disk that fills (or a folder made read-only)
while training, a loss that turns NaN, a model too large for the memory; and arrays of
other libraries handed to a layer or to ``ff.asarray``."""

from __future__ import annotations

import errno
import fcntl
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow import train as T
from fuseflow.cli import _COPIES, _write_failed, peak_copies
from fuseflow.train import _fit, _run_folder
from fuseflow.train._run_folder import (LOCK_FILE, RunFolder, RunFolderError, latest_checkpoint,
                                        needs_overwrite)
from tests.test_cli_safety import DIGITS, assert_one_line_error, snapshot

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------- one run per output folder

def test_a_folder_in_use_is_refused_and_free_again_when_the_run_ends(tmp_path):
    first = RunFolder(tmp_path / "run")
    first.check()
    assert (tmp_path / "run" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    with pytest.raises(RunFolderError, match=rf"another fuseflow run \(process {os.getpid()}\) "
                                             r"is writing to this folder.*Fix: wait until it "
                                             r"ends, or --out NEW_DIR"):
        RunFolder(tmp_path / "run").check()
    first.close()
    assert not (tmp_path / "run").exists()  # made by the run, nothing saved: removed again
    second = RunFolder(tmp_path / "run")
    second.check()
    second.close()


def test_a_second_train_into_a_busy_folder_changes_nothing(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *DIGITS, "--epochs", "1", "--out", out).returncode == 0
    assert not (out / LOCK_FILE).exists()  # released when the run ended
    before = snapshot(out)
    # another process holds the folder, as a run in progress does
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from fuseflow.train._run_folder import RunFolder\n"
         f"f = RunFolder(Path({str(out)!r})); f.check(); print('held', flush=True)\n"
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = cli("train", *DIGITS, "--epochs", "1", "--out", out, "--overwrite")
        assert_one_line_error(proc, f"--out {out}: another fuseflow run (process "
                                    f"{holder.pid}) is writing to this folder",
                              "Fix: wait until it ends, or --out NEW_DIR")
        assert "data:" not in proc.stdout  # refused before any work
    finally:
        holder.communicate("")  # it exits without a clean-up, as a killed run does
    stale = snapshot(out)
    assert stale.pop(LOCK_FILE) and stale == before
    # the lock went with the process: a file left behind does not hold the folder
    assert cli("train", *DIGITS, "--epochs", "2", "--resume", out / T.LAST).returncode == 0
    assert not (out / LOCK_FILE).exists()


# ---------------------------------------------------------- a write fails while training

def _failing_saves(monkeypatch, name, error=None):
    """``save_state`` fails (a full disk) for the checkpoint file ``name`` of epoch 2."""
    save = _fit.save_state

    def fails(path, state, *args, **kwargs):
        if Path(path).name == name and state.epoch == 2:
            raise error or OSError(errno.ENOSPC, "No space left on device")
        return save(path, state, *args, **kwargs)

    monkeypatch.setattr(_fit, "save_state", fails)
    return save


@pytest.mark.parametrize("fails, resumes", [("ckpt-epoch2.safetensors", T.LAST),
                                            (T.LAST, "ckpt-epoch2.safetensors")])
def test_a_full_disk_during_training_is_one_line_whose_resume_works(tmp_path, cli, monkeypatch,
                                                                    fails, resumes):
    save = _failing_saves(monkeypatch, fails)
    out = tmp_path / "run"
    proc = cli("train", *DIGITS, "--epochs", "3", "--out", out)
    line = assert_one_line_error(proc, f"cannot write the run's files in {out} (No space left "
                                       "on device)", "Every file saved before is whole",
                                 f"continue with: fuseflow train --resume {out / resumes}.",
                                 "Fix: free disk space")
    assert "--overwrite" not in line  # the record whose checkpoint failed was cut off again
    assert not (out / LOCK_FILE).exists()
    assert [r["epoch"] for r in T.read_metrics(out / T.METRICS_FILE)] == \
        ([1] if fails != T.LAST else [1, 2])
    monkeypatch.setattr(_fit, "save_state", save)
    proc = cli("train", "--resume", out / resumes, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert [r["epoch"] for r in T.read_metrics(out / T.METRICS_FILE)] == [1, 2, 3]


def test_a_resume_the_folder_would_refuse_is_given_with_overwrite(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *DIGITS, "--epochs", "1", "--out", out).returncode == 0
    with open(out / T.METRICS_FILE, "a") as f:  # a record whose checkpoint never came
        f.write('{"epoch": 2, "step": 44, "train_loss": 1.0}\n')
    assert latest_checkpoint(out) == out / T.LAST and needs_overwrite(out, out / T.LAST)
    line = _write_failed(OSError(errno.ENOSPC, "No space left on device"), out, None)
    assert f"continue with: fuseflow train --resume {out / T.LAST} --overwrite." in line
    proc = cli("train", "--resume", out / T.LAST, "--epochs", "2", "--overwrite",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr


def test_a_folder_made_read_only_while_training_is_still_one_line(tmp_path, cli, monkeypatch):
    _failing_saves(monkeypatch, "ckpt-epoch2.safetensors",
                   PermissionError(errno.EACCES, "Permission denied"))
    unlink = Path.unlink

    def read_only(path, *args, **kwargs):  # root could still unlink: refuse as the OS would
        if path.name == LOCK_FILE:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only)
    out = tmp_path / "run"
    proc = cli("train", *DIGITS, "--epochs", "3", "--out", out)
    assert_one_line_error(proc, f"cannot write the run's files in {out} (Permission denied)",
                          f"--resume {out / T.LAST}")
    monkeypatch.setattr(Path, "unlink", unlink)
    # the file left behind holds nothing: the lock ended with the run
    assert cli("train", *DIGITS, "--epochs", "1", "--out", tmp_path / "next").returncode == 0
    assert (out / LOCK_FILE).exists() and RunFolder(out).check() is None


def test_a_file_system_without_locks_warns_and_trains(tmp_path, cli, monkeypatch):
    class NoFlock:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, op):
            raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(_run_folder, "fcntl", NoFlock)
    fds = len(os.listdir("/proc/self/fd"))
    out = tmp_path / "run"
    proc = cli("train", *DIGITS, "--epochs", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith(
        f"fuseflow train: warning: --out {out}: this file system does not lock files "
        "(Function not implemented)"), proc.stderr
    assert not (out / LOCK_FILE).exists() and len(os.listdir("/proc/self/fd")) == fds


def test_a_closed_stdout_stops_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fuseflow", "train", *DIGITS, "--epochs",
                             "20", "--out", str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().startswith("backend:")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "cannot write" not in err, err


# ---------------------------------------------------------------- a loss that is not a number

def _digits_fit(tmp_path, nan=True, **kwargs):
    """Two epochs on digits; ``nan``: from params of which one weight is NaN, as those of a
    run that diverged are (NaN spreads to every logit: the loss is NaN from the first step)."""
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10))
    opt = ff.optim.sgd(0.1)
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    if nan:
        state.params[0]["w"][0, 0] = np.nan
    return T.fit(model, opt, state, ff.data.digits("train"), ff.data.digits("test"), epochs=2,
                 batch_size=64, out_dir=tmp_path / "run", progress=False, log=None, **kwargs)


def test_fit_stops_at_the_first_epoch_whose_loss_is_not_finite(tmp_path):
    with np.errstate(all="ignore"), pytest.raises(T.Diverged) as info:
        _digits_fit(tmp_path)
    e = info.value
    assert (e.epoch, e.checkpoint, e.saved_epoch) == (1, None, 0) and not math.isfinite(e.loss)
    assert "training diverged" in str(e) and "Fix: a smaller learning rate" in str(e)
    assert not list((tmp_path / "run").glob("*.safetensors"))  # nothing of it saved
    assert not (tmp_path / "run" / T.METRICS_FILE).exists()


def test_fit_trains_on_through_nan_when_asked(tmp_path):
    with np.errstate(all="ignore"):
        result = _digits_fit(tmp_path, stop_on_nonfinite=False)
    assert [math.isnan(r["train_loss"]) for r in result.history] == [True, True]
    assert result.checkpoint == tmp_path / "run" / T.LAST


def test_a_float16_step_skipped_for_overflow_is_no_divergence(tmp_path):
    """One batch overflows float16 in the forward (an input of 7e4 > 65504): that step's loss
    is NaN, dynamic loss scaling skips it with the params unchanged, and training goes on."""
    x, y = ff.data.digits("train")
    x = x.copy()
    x[5, 0] = 7e4
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10))
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3))
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    losses = []
    with np.errstate(all="ignore"):
        result = T.fit(model, opt, state, (x, y), ff.data.digits("test"), epochs=2,
                       batch_size=64, compute_dtype="float16", progress=False, log=None,
                       on_step=lambda s, m: losses.append(float(m["loss"])))
    assert sum(not math.isfinite(v) for v in losses) >= 2  # the batch, in both epochs
    assert result.state.epoch == 2 and result.test.accuracy > 0.3
    assert all(bool(np.isfinite(w).all()) for w in ff.tree.leaves(result.state.params))


def test_a_healthy_run_is_not_stopped(tmp_path):
    result = _digits_fit(tmp_path, nan=False)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"] < 2.3


def test_a_diverged_cli_run_is_one_line_with_a_smaller_lr(tmp_path, cli):
    out = tmp_path / "new" / "run"
    proc = cli("train", "--dataset", "digits", "--optimizer", "sgd", "--lr", "1e4", "--epochs",
               "3", "--out", out, "--no-progress")
    assert_one_line_error(proc, "epoch 1's training loss is nan: the run diverged",
                          "--lr 10000 is too high", "this run saved no epoch",
                          "Fix: a new run with a smaller --lr, e.g. --lr 1000")
    assert not (tmp_path / "new").exists()  # made by the run, nothing saved: removed again


# ------------------------------------------------------------------ a model too large to train

def test_the_memory_check_counts_what_training_holds_at_its_peak(tmp_path, cli, monkeypatch):
    import fuseflow.cli as cli_module

    params = (64 + 1) * 4000 + (4000 + 1) * 10  # --hidden 4000 on digits
    for optimizer in _COPIES["float32"]:
        copies = peak_copies("float32", optimizer)
        # the machine's memory: a little more than params + grads + slots, less than the peak
        slots = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}[optimizer]
        monkeypatch.setattr(cli_module, "_physical_memory", lambda s=slots: params * 4 * (3 + s))
        proc = cli("train", "--dataset", "digits", "--hidden", "4000", "--optimizer", optimizer,
                   "--out", tmp_path / optimizer, "--no-progress")
        assert_one_line_error(proc, f"{params:,} parameters", f"with {optimizer} takes about",
                              f"{copies} float32 copies", "Fix: smaller --hidden")
        assert not (tmp_path / optimizer).exists()
    proc = cli("bench", "--hidden", "4000", "--input-width", "64", "--classes", "10")
    assert_one_line_error(proc, "--hidden 4000", "Fix: smaller --hidden", command="bench")
    # float16 on the CPU holds more (16-bit copies of the params and gradients): memory
    # that float32 Adam fits in is refused to it
    between = (peak_copies("float32", "adam") + peak_copies("float16", "adam")) / 2
    assert peak_copies("float32", "adam") < between < peak_copies("float16", "adam")
    monkeypatch.setattr(cli_module, "_physical_memory", lambda: int(params * 4 * between))
    proc = cli("train", "--dataset", "digits", "--hidden", "4000", "--precision", "float16",
               "--out", tmp_path / "f16", "--no-progress")
    assert_one_line_error(proc, f"{peak_copies('float16', 'adam')} float32 copies",
                          "Fix: smaller --hidden")
    # bfloat16 without loss scaling also keeps the params' bfloat16 copy: memory that the
    # loss-scaled run fits in is refused to it
    unscaled = peak_copies("bfloat16", "adam", "none")
    assert unscaled > peak_copies("bfloat16", "adam")
    monkeypatch.setattr(cli_module, "_physical_memory",
                        lambda: int(params * 4 * (unscaled - 0.5)))
    proc = cli("train", "--dataset", "digits", "--hidden", "4000", "--precision", "bfloat16",
               "--loss-scaling", "none", "--out", tmp_path / "bf16", "--no-progress")
    assert_one_line_error(proc, f"{unscaled} float32 copies", "Fix: smaller --hidden")


# ------------------------------------------------------------- arrays of other libraries

class _ArrayLike:
    """Shape and a NumPy dtype, as a JAX array has, but not NumPy's or CuPy's."""
    shape, dtype, ndim = (4, 20), np.dtype(np.float32), 2


def test_a_layer_refuses_arrays_that_are_not_numpy_or_cupy():
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    _, params = model.init(ff.random.key(0), (20,))
    with pytest.raises(nn.LayerError, match=r"Serial layer 0 \(Dense\(8, activation='relu'\)\): "
                                            r"input must be an array \(NumPy or CuPy\), got "
                                            r"tests\._ArrayLike\..*"
                                            r"ff.asarray\(x\) for a PyTorch/JAX tensor"):
        model.apply(params, _ArrayLike())


def test_a_jax_array_gets_the_layer_error_and_goes_in_through_asarray():
    jnp = pytest.importorskip("jax.numpy")
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    _, params = model.init(ff.random.key(0), (20,))
    x = jnp.asarray(ff.random.normal(ff.random.key(1), (4, 20)))
    with pytest.raises(nn.LayerError, match=r"got jaxlib\.\w+\..*Fix: .*ff.asarray"):
        model.apply(params, x)
    y = model.apply(params, ff.asarray(x))
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, model.apply(params, np.asarray(x)))


def test_asarray_takes_jax_bfloat16_and_names_what_dlpack_cannot_carry():
    """NumPy's DLPack has no bfloat16: JAX's bfloat16 arrays come through their own
    conversion (ml_dtypes' dtype, the same bits); a dtype nothing here holds gets the
    message that says to convert it first."""
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(80, dtype=jnp.float32).reshape(4, 20).astype(jnp.bfloat16) / 7
    got = ff.asarray(x)
    assert isinstance(got, np.ndarray) and got.dtype == ff.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), np.asarray(x).view(np.uint16))

    class Float8:  # a DLPack producer whose dtype NumPy cannot take, as float8 is
        dtype = "float8_e4m3fn"

        def __dlpack__(self, **_):
            raise BufferError("Unsupported dtype in DLTensor")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match=r"ff.asarray: cannot take a \w+ Float8 of dtype "
                                        r"float8_e4m3fn through DLPack.*Fix: convert it to a "
                                        r"float32.*x.astype\(jnp.float32\)"):
        ff.asarray(Float8())
