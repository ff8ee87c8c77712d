"""The ``fuseflow`` command: its output, files and exit codes.

What only a real process shows (the last line, Ctrl-C, the offline fallback, the console
script) runs as a subprocess; the rest calls ``fuseflow.cli.main`` in this process, which is
the same code without paying for a fresh interpreter each time. Small runs on scikit-learn's
digits (and on IDX files written here from them) keep this file fast; one test trains one
epoch on real MNIST when the files are there.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import train as T
from fuseflow.cli import main

ACCURACY_LINE = re.compile(r"^test_accuracy=(0\.\d{4}|1\.0000)$")
SMALL = ["--hidden", "32", "--batch-size", "64", "--lr", "0.01", "--no-progress"]


def _env(**extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    env.update(extra)
    return env


def run(*args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "fuseflow", *map(str, args)], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True, timeout=timeout)


def _last_line(proc):
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    return lines[-1]


def _accuracy(proc) -> float:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    last = _last_line(proc)
    assert ACCURACY_LINE.match(last), f"last line is {last!r}"
    return float(last.split("=")[1])


def write_idx_folder(folder: Path, classes=10):
    """The four MNIST-named IDX files, gzipped, holding digits (8x8) with labels < classes."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = ff.data.digits(split)
        keep = y < classes
        images = np.round(x[keep] * 255).astype(np.uint8).reshape(-1, 8, 8)
        labels = y[keep].astype(np.uint8)
        for name, arr in ((f"{prefix}-images-idx3-ubyte.gz", images),
                          (f"{prefix}-labels-idx1-ubyte.gz", labels)):
            header = bytes([0, 0, 0x08, arr.ndim]) + np.array(arr.shape, ">u4").tobytes()
            (folder / name).write_bytes(gzip.compress(header + arr.tobytes()))
    return folder


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "run"
    proc = run("train", "--dataset", "digits", "--epochs", "2", "--out", out, *SMALL)
    return out, proc


# ------------------------------------------------------------------------------- train

def test_train_prints_backend_then_ends_with_the_accuracy(digits_run):
    out, proc = digits_run
    acc = _accuracy(proc)
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("backend: ")] == \
        ["backend: numpy (auto: no usable CUDA GPU)" if not ff.backend.cuda_available()
         else "backend: cuda"]
    assert sum(line.startswith("epoch ") for line in lines) == 2
    assert acc > 0.5
    assert sorted(p.name for p in out.iterdir()) == [
        "ckpt-epoch1.safetensors", "ckpt-epoch2.safetensors", "curves.png",
        "last.safetensors", "metrics.jsonl"]
    records = T.read_metrics(out / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    assert f"{records[-1]['test_acc']:.4f}" == f"{acc:.4f}"


def test_eval_agrees_with_train(digits_run, cli):
    out, proc = digits_run
    trained = _last_line(proc)
    for ckpt in ("last.safetensors", "ckpt-epoch2.safetensors"):
        evaluated = cli("eval", out / ckpt)
        _accuracy(evaluated)
        assert _last_line(evaluated) == trained


def test_checkpoint_metadata_holds_the_model_recipe(digits_run):
    out, _ = digits_run
    meta = ff.checkpoint.read_metadata(out / "last.safetensors")
    recipe = T.Recipe.from_metadata(meta["recipe"])
    assert (recipe.dataset, recipe.hidden, recipe.activation) == ("digits", (32,), "relu")
    assert (recipe.input_width, recipe.classes) == (64, 10)


def test_resume_continues_the_run_exactly(tmp_path, digits_run, cli):
    out, straight = digits_run
    # epoch 2 again, from the first epoch's checkpoint, into another folder
    resumed = cli("train", "--resume", out / "ckpt-epoch1.safetensors", "--out", tmp_path,
                  "--no-progress")
    assert "resuming" in resumed.stdout and "at epoch 1" in resumed.stdout
    assert _last_line(resumed) == _last_line(straight)
    a = T.read_metrics(out / "metrics.jsonl")
    b = T.read_metrics(tmp_path / "metrics.jsonl")  # epoch 1 carried over, epoch 2 new
    assert [(r["epoch"], r["train_loss"], r["test_loss"], r["test_acc"]) for r in a] == \
        [(r["epoch"], r["train_loss"], r["test_loss"], r["test_acc"]) for r in b]


def test_resume_refuses_options_that_change_the_run(digits_run, cli):
    out, _ = digits_run
    proc = cli("train", "--resume", out / "last.safetensors", "--hidden", "64")
    assert proc.returncode == 1
    assert "--hidden 64 (the checkpoint has 32)" in proc.stderr
    assert "Fix:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("precision, scaling, changed", [
    ("float16", "dynamic", ("--dtype", "float32", "--precision float32")),
    ("bfloat16", "none", ("--loss-scaling", "dynamic", "--loss-scaling dynamic")),
])
def test_16bit_run_records_its_precision_and_resumes_in_it(tmp_path, cli, precision, scaling,
                                                           changed):
    """float16 (dynamic loss scaling, the default) and bfloat16 with --loss-scaling none
    (compute_copy: the params' bfloat16 copy saved in the optimizer state): the recipe
    records both settings, a resumed run ends bit for bit where the straight run does, and
    changing either on --resume is refused."""
    extra = ["--loss-scaling", scaling] if scaling != "dynamic" else []
    proc = cli("train", "--dataset", "digits", "--epochs", "2", "--precision", precision,
               *extra, "--out", tmp_path, *SMALL)
    _accuracy(proc)
    shown = "no loss scaling" if scaling == "none" else "dynamic loss scaling"
    assert f"; {precision} ({shown});" in proc.stdout
    path = tmp_path / "last.safetensors"
    recipe = T.Recipe.from_metadata(ff.checkpoint.read_metadata(path)["recipe"])
    assert (recipe.precision, recipe.loss_scaling) == (precision, scaling)
    model, opt = recipe.model(), recipe.optimizer_for(1)
    state = T.load_state(path, like=T.init_state(model, opt, recipe.in_shape, ff.random.key(0)))
    want = {"dynamic": "DynamicScaleState", "none": "ComputeCopyState"}[scaling]
    assert type(state.opt_state).__name__ == want
    if scaling == "none":
        for c, p in zip(ff.tree.leaves(state.opt_state.compute_params),
                        ff.tree.leaves(state.params)):
            np.testing.assert_array_equal(np.asarray(c), p.astype(ff.bfloat16))
    refused = cli("train", "--resume", tmp_path / "ckpt-epoch1.safetensors", *changed[:2])
    assert refused.returncode == 1 and changed[2] in refused.stderr
    resumed = cli("train", "--resume", tmp_path / "ckpt-epoch1.safetensors", "--out",
                  tmp_path / "resumed", "--no-progress")
    assert _last_line(resumed) == _last_line(proc)


def test_bfloat16_runs_without_loss_scaling_unless_asked(tmp_path, cli):
    """--loss-scaling left out: none in bfloat16 (as PyTorch and JAX train it), dynamic in
    float16; --loss-scaling dynamic still gives bfloat16 the loss-scaled run."""
    for precision, extra, want in (("bfloat16", [], "none"), ("float16", [], "dynamic"),
                                   ("bfloat16", ["--loss-scaling", "dynamic"], "dynamic")):
        out = tmp_path / f"{precision}-{want}"
        proc = cli("train", "--dataset", "digits", "--epochs", "1", "--precision", precision,
                   *extra, "--out", out, *SMALL)
        _accuracy(proc)
        recipe = ff.checkpoint.read_metadata(out / "last.safetensors")["recipe"]
        assert recipe["loss_scaling"] == want, (precision, extra)
    bench = cli("bench", "--precision", "bfloat16", "--hidden", "8", "--steps", "1",
                "--warmup", "0")
    assert bench.returncode == 0 and "bfloat16 (no loss scaling)" in bench.stdout


def test_loss_scaling_none_is_refused_but_in_bfloat16(tmp_path, cli):
    proc = cli("train", "--dataset", "digits", "--precision", "float16", "--loss-scaling",
               "none", "--out", tmp_path, *SMALL)
    assert proc.returncode == 1 and "float16 needs loss scaling" in proc.stderr
    assert "Fix: --precision bfloat16" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("bench", "--loss-scaling", "none", "--hidden", "8", "--steps", "1")
    assert proc.returncode == 1 and "float32 scales no loss anyway" in proc.stderr
    assert "Fix: add --precision bfloat16" in proc.stderr and "Traceback" not in proc.stderr


def test_a_recipe_without_loss_scaling_is_an_earlier_run_with_dynamic_scaling():
    """Checkpoints written before --loss-scaling was recorded trained with dynamic loss
    scaling: their recipe reads so, and rebuilds that optimizer (and its state's layout)."""
    recipe = T.Recipe(dataset="digits", data_dir=None, input_width=64, classes=10,
                      hidden=(8,), precision="bfloat16")
    meta = recipe.to_metadata()
    del meta["loss_scaling"]
    old = T.Recipe.from_metadata(meta)
    assert old.loss_scaling == "dynamic" and old == recipe
    state = old.optimizer_for(1).init(old.model().init(ff.random.key(0), old.in_shape)[1])
    assert type(state).__name__ == "DynamicScaleState"


def test_a_second_run_does_not_overwrite_the_first(digits_run, tmp_path, cli):
    out, _ = digits_run
    proc = cli("train", "--dataset", "digits", "--epochs", "1", "--out", out, *SMALL)
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    assert "--overwrite" in proc.stderr
    target = tmp_path / "again"
    cli("train", "--dataset", "digits", "--epochs", "2", "--out", target, *SMALL)
    again = cli("train", "--dataset", "digits", "--epochs", "1", "--out", target, "--overwrite",
                *SMALL)
    _accuracy(again)
    assert sorted(p.name for p in target.glob("ckpt-*")) == ["ckpt-epoch1.safetensors"]


def test_data_dir_takes_any_idx_folder(tmp_path, cli):
    folder = write_idx_folder(tmp_path / "idx", classes=7)
    proc = cli("train", "--data-dir", folder, "--epochs", "2", "--out", tmp_path / "run", *SMALL)
    acc = _accuracy(proc)
    assert f"IDX files in {folder.resolve()}" in proc.stdout
    assert "64 inputs, 7 classes" in proc.stdout
    assert acc > 0.3
    meta = ff.checkpoint.read_metadata(tmp_path / "run" / "last.safetensors")["recipe"]
    assert (meta["dataset"], meta["input_width"], meta["classes"]) == ("idx", 64, 7)
    assert _last_line(cli("eval", tmp_path / "run" / "last.safetensors")) == _last_line(proc)


@pytest.mark.parametrize("given", ["mnist", "parent"])
def test_data_dir_names_the_default_output_folder(tmp_path, cli, monkeypatch, given):
    """``--data-dir ../data/mnist`` (or ``../data``) writes to runs/mnist, the folder that
    the docs' ``fuseflow eval runs/mnist/last.safetensors`` reads."""
    folder = write_idx_folder(tmp_path / "data" / "mnist", classes=7)
    monkeypatch.chdir(tmp_path)
    proc = cli("train", "--data-dir", folder if given == "mnist" else folder.parent,
               "--epochs", "1", *SMALL)
    _accuracy(proc)
    assert (tmp_path / "runs" / "mnist" / "last.safetensors").is_file()


def test_data_dir_without_the_files_is_an_error_not_a_fallback(tmp_path, cli):
    proc = cli("train", "--data-dir", tmp_path, "--epochs", "1", "--out", tmp_path / "o", *SMALL)
    assert proc.returncode == 1
    assert "train-images-idx3-ubyte" in proc.stderr and "digits" not in proc.stdout


def test_without_mnist_and_network_it_trains_on_digits(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    # no local MNIST anywhere, and every download refused at once by a dead proxy
    offline = _env(FUSEFLOW_DATA=str(empty), XDG_CACHE_HOME=str(empty), HOME=str(empty),
                   https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9",
                   HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
                   no_proxy="", NO_PROXY="")
    proc = run("train", "--epochs", "1", *SMALL, env=offline, cwd=tmp_path)
    _accuracy(proc)
    notes = [line for line in proc.stdout.splitlines() if "digits instead" in line]
    assert len(notes) == 1 and notes[0].startswith("MNIST not found")
    assert (tmp_path / "runs" / "digits" / "last.safetensors").is_file()
    assert not list(empty.rglob("*.gz"))  # nothing was downloaded


def test_cuda_backend_without_a_gpu_is_a_clear_error(cli):
    if ff.backend.cuda_available():
        pytest.skip("a CUDA GPU is available here")
    proc = cli("train", "--backend", "cuda", "--dataset", "digits", "--epochs", "1")
    assert proc.returncode == 1
    assert "CUDA backend is not available" in proc.stderr and "Fix:" in proc.stderr
    assert "or --backend numpy (or auto)." in proc.stderr  # the CLI's words, not Python's
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("signum, code, said", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, r"terminated \(SIGTERM\)")])
def test_ctrl_c_or_sigterm_stops_cleanly_and_keeps_the_last_checkpoint(tmp_path, signum, code,
                                                                      said):
    """Ctrl-C, or SIGTERM (``kill``, a scheduler's preemption), stops after the step in
    progress: the last full checkpoint stays, and the last line says how to continue."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuseflow", "train", "--dataset", "digits", "--epochs", "500",
         "--out", str(out), *SMALL], env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,  # Ctrl-C handled as from a terminal, even if
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # pytest ignores it
    deadline = time.monotonic() + 120
    while not (out / "ckpt-epoch2.safetensors").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signum)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"still running 60 s after {signum!r}\n{stdout}\n{stderr}")
    assert proc.returncode == code, stdout + stderr
    last = stdout.strip().splitlines()[-1]
    m = re.match(said + r": last full checkpoint: (\S+) \(epoch (\d+)\); continue with: "
                 r"fuseflow train --resume (\S+)$", last)
    assert m, last
    assert Path(m.group(1)) == out / "last.safetensors" and m.group(3) == m.group(1)
    assert "Traceback" not in stderr
    meta = ff.checkpoint.read_metadata(out / "last.safetensors")
    assert meta["metrics"]["epoch"] == int(m.group(2)) >= 2
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no half-written files
    assert not list(out.glob("ckpt-epoch%s.*" % (int(m.group(2)) + 1)))


# -------------------------------------------------------------------------- eval, bench

def test_eval_of_a_missing_or_foreign_file_says_so(tmp_path, cli):
    proc = cli("eval", tmp_path / "nope.safetensors")
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    ff.checkpoint.save(tmp_path / "plain.safetensors", {"w": np.zeros(3)})
    proc = cli("eval", tmp_path / "plain.safetensors")
    assert proc.returncode == 1 and "not written by `fuseflow train`" in proc.stderr


def test_bench_prints_steps_per_second(cli):
    proc = cli("bench", "--hidden", "32,32", "--steps", "5", "--batch-size", "16")
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"^steps_per_s=[\d.]+ samples_per_s=\d+ ms_per_step=[\d.]+$",
                    _last_line(proc))


@pytest.mark.parametrize("args, code, says", [
    (["train", "--hidden", "12,x"], 2, "layer widths"),
    (["train", "--epochs", "0"], 2, "positive int"),
    (["frobnicate"], 2, "invalid choice"),
    (["--help"], 0, "train"),
])
def test_usage_errors_exit_2(args, code, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    assert info.value.code == code and says in out + err


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("fuseflow")
    if not script.exists():
        pytest.skip("the fuseflow console script is not installed next to this Python")
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("fuseflow ")


# ---------------------------------------------------------------------------- real MNIST

def test_one_epoch_on_real_mnist(mnist_dir, tmp_path, cli):
    proc = run("train", "--data-dir", mnist_dir, "--epochs", "1", "--out", tmp_path,
               "--no-progress", timeout=600)
    acc = _accuracy(proc)
    assert "60000 train, 10000 test, 784 inputs, 10 classes" in proc.stdout
    assert acc >= 0.96
    assert _last_line(cli("eval", tmp_path / "last.safetensors")) == _last_line(proc)
