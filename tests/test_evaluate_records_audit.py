"""Audit of ``ff.train.evaluate``, metrics.jsonl / curves.png, and ``fuseflow eval`` /
``fuseflow bench``, against references written here (NumPy, float64) on fresh random data.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import warnings

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow import train as T
from fuseflow.train import _records as R

PNG = b"\x89PNG\r\n\x1a\n"


def _model_params(rng, width, classes, dtype="float32"):
    model = nn.Serial(nn.Dense(16, "relu"), nn.Dense(classes))
    state = T.init_state(model, ff.optim.sgd(0.1), (width,),
                         ff.random.key(int(rng.integers(2**31))))
    return model, ff.tree.map(lambda a: a.astype(dtype), state.params)


def _ce_reference(logits, y):
    z = np.asarray(logits, np.float64)
    m = z.max(1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(1)) + m[:, 0]
    return float((lse - z[np.arange(len(y)), y.astype(np.int64)]).mean())


# ---------------------------------------------------------------------------- evaluate

@pytest.mark.parametrize("dtype,rel", [("float32", 1e-5), ("float64", 1e-12),
                                       ("float16", 2e-3)])
@pytest.mark.parametrize("n", [1, 37, 1001])
def test_evaluate_matches_a_numpy_reference_for_any_batch_size(rng, dtype, rel, n):
    model, params = _model_params(rng, 5, 7, dtype)
    x = (rng.standard_normal((n, 5)) * 2).astype(dtype)
    y = rng.integers(0, 7, n)
    logits = np.asarray(model.apply(params, x))
    want_loss = _ce_reference(logits, y)
    want_correct = int((logits.argmax(1) == y).sum())
    for label_dtype in (np.int8, np.uint8, np.int64):
        for batch in (1, 10, n, n + 5, 1000):
            r = T.evaluate(model, params, x, y.astype(label_dtype), batch)
            assert (r.count, r.correct) == (n, want_correct), (label_dtype, batch)
            assert type(r.correct) is int and type(r.loss) is float
            assert r.accuracy == want_correct / n  # exact: a count, not a mean of means
            assert r.loss == pytest.approx(want_loss, rel=rel, abs=rel), (label_dtype, batch)


def test_evaluate_with_one_hot_targets_gives_the_loss_and_no_accuracy(rng):
    """A loss on one-hot targets (mse): evaluate compared argmax (n,) with targets (n, k),
    a broadcasting ValueError after the whole forward. Like make_step, accuracy is only
    for integer class labels."""
    model, params = _model_params(rng, 5, 4)
    n = int(rng.integers(20, 60))
    x = rng.standard_normal((n, 5)).astype(np.float32)
    t = np.eye(4, dtype=np.float32)[rng.integers(0, 4, n)]
    r = T.evaluate(model, params, x, t, 7, loss_fn=ff.losses.mse)
    out = np.asarray(model.apply(params, x), np.float64)
    assert r.loss == pytest.approx(((out - t) ** 2).mean(), rel=1e-5)
    assert (r.accuracy, r.correct, r.count) == (None, None, n)


def test_evaluate_regression_accuracy_is_never_above_one(rng):
    """One output and (n, 1) float targets broadcast to an (n, n) comparison: the old code
    reported correct > count (accuracy 53.0 for 53 rows), changing with the batch size."""
    model, params = _model_params(rng, 5, 1)
    n = int(rng.integers(20, 60))
    x = rng.standard_normal((n, 5)).astype(np.float32)
    t = np.zeros((n, 1), np.float32)  # argmax of one output is 0: every row "matches"
    for batch in (8, 1000):
        r = T.evaluate(model, params, x, t, batch, loss_fn=ff.losses.mse)
        assert r.accuracy is None or 0 <= r.accuracy <= 1
        assert r.count == n


def test_fit_with_mse_on_one_hot_targets_saves_its_epoch_and_plots_quietly(rng, tmp_path):
    """fit used to train the epoch, then die in evaluate before saving anything; and a
    panel with nothing to plot (no accuracy) raised matplotlib's legend warning per epoch."""
    model = nn.Serial(nn.Dense(16, "relu"), nn.Dense(3))
    opt = ff.optim.sgd(0.05)
    state = T.init_state(model, opt, (5,), ff.random.key(int(rng.integers(2**31))))
    x = rng.standard_normal((60, 5)).astype(np.float32)
    t = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 60)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = T.fit(model, opt, state, (x, t), (x, t), epochs=2, batch_size=10,
                  loss_fn=ff.losses.mse, out_dir=tmp_path, progress=False, log=None)
    records = T.read_metrics(tmp_path)
    assert [q["epoch"] for q in records] == [1, 2]
    assert records[-1]["test_acc"] is None and records[-1]["test_loss"] == r.test.loss
    out = np.asarray(model.apply(r.state.params, x), np.float64)
    assert r.test.loss == pytest.approx(((out - t) ** 2).mean(), rel=1e-5)
    assert (tmp_path / "ckpt-epoch2.safetensors").is_file()
    assert (tmp_path / T.CURVES_FILE).read_bytes().startswith(PNG)


# ------------------------------------------------------------------------ metrics.jsonl

def test_metrics_round_trip_non_finite_extreme_and_unicode(rng, tmp_path):
    big, tiny = float(rng.uniform(1, 1.8)) * 1e308, 5e-324 * int(rng.integers(1, 9))
    rec = {"epoch": 1, "step": 2**53 + 1, "train_loss": float("nan"), "train_acc": big,
           "test_loss": float("inf"), "test_acc": tiny, "seconds": -math.inf,
           "samples_per_s": float(rng.random()), "note": "héllo ✓ 日本 \U0001f600",
           "nested": {"a": [float("nan"), 1.5]}}
    R.append_metrics(tmp_path, rec)
    text = (tmp_path / T.METRICS_FILE).read_text()
    assert text.endswith("\n") and "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    (got,) = T.read_metrics(tmp_path)
    assert got == dict(rec, train_loss=None, test_loss=None, seconds=None,
                       nested={"a": [None, 1.5]})


def test_hand_edited_files_blank_lines_crlf_and_a_byte_order_mark(tmp_path):
    path = tmp_path / T.METRICS_FILE
    path.write_bytes(b'{"epoch": 1}\r\n\r\n   \n{"epoch": 2}\r\n\n')
    assert [r["epoch"] for r in T.read_metrics(path)] == [1, 2]
    # Notepad and other editors may save UTF-8 with a BOM: the records are still readable
    path.write_text('\ufeff{"epoch": 1, "note": "é"}\n{"epoch": 2}\n', encoding="utf-8")
    assert T.read_metrics(tmp_path) == [{"epoch": 1, "note": "é"}, {"epoch": 2}]


@pytest.mark.parametrize("bad", ["null", '"2"', "true", "1.5"])
def test_a_record_whose_epoch_is_not_an_integer_is_reported_with_its_line(tmp_path, bad):
    """It was read, then compared with an int while keeping or cutting epochs: a TypeError
    traceback from fit and from `fuseflow train --resume`."""
    path = tmp_path / T.METRICS_FILE
    path.write_text(f'{{"epoch": 1}}\n{{"epoch": {bad}, "step": 3}}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: .*epoch.*integer.*Fix: "):
        T.read_metrics(path)
    # a torn last line is still only a warning
    path.write_text('{"epoch": 1}\n{"epoch": 2, "st')
    with pytest.warns(RuntimeWarning, match="cut short"):
        assert T.read_metrics(path) == [{"epoch": 1}]


def test_cli_resume_reports_a_hand_edited_epoch_in_one_line(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", "--dataset", "digits", "--hidden", "16", "--epochs", "1",
               "--no-progress", "--out", out).returncode == 0
    path = out / T.METRICS_FILE
    path.write_text(path.read_text().replace('"epoch": 1', '"epoch": null'))
    r = cli("train", "--resume", out / T.LAST, "--epochs", "2", "--no-progress")
    assert r.returncode == 1, r.stderr
    assert re.search(r"error: .*metrics.jsonl:1: .*integer.*Fix: ", r.stderr)


def _append_many(args):
    folder, who, count = args
    for i in range(count):
        R.append_metrics(folder, {"epoch": i, "who": who, "pad": "x" * (who * 300)})


def test_concurrent_appends_leave_whole_lines(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_append_many, [(tmp_path, w, 60) for w in range(4)])
    records = T.read_metrics(tmp_path)
    assert len(records) == 240
    for w in range(4):
        mine = [r for r in records if r["who"] == w]
        assert [r["epoch"] for r in mine] == list(range(60))
        assert all(r["pad"] == "x" * (w * 300) for r in mine)


# --------------------------------------------------------------------------- curves.png

def _rec(epoch, **kw):
    r = dict(epoch=epoch, step=epoch * 10, train_loss=1 / (epoch + 1), train_acc=0.5,
             test_loss=1 / (epoch + 2), test_acc=0.6, seconds=1.0, samples_per_s=10.0)
    return dict(r, **kw)


@pytest.mark.parametrize("records", [
    [_rec(1)],
    [_rec(1, train_loss=float("nan"), test_loss=float("inf")), _rec(2, test_acc=None)],
    [_rec(1, train_acc=None, test_loss=None, test_acc=None),
     _rec(2, train_acc=None, test_loss=None, test_acc=None)],
    [_rec(1, train_loss=float("nan"), train_acc=None, test_loss=None, test_acc=None)],
    [_rec(e) for e in range(1, 401)],
    [],
    [{"train_loss": 1.0}, _rec(2)],  # a hand-written record without an epoch
], ids=["one-epoch", "nan-inf", "no-accuracy", "all-nan", "400-epochs", "empty", "no-epoch"])
def test_plot_curves_draws_any_history_without_warnings(tmp_path, records):
    path = tmp_path / T.CURVES_FILE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        R.plot_curves(records, path)
    assert path.read_bytes().startswith(PNG)
    assert [p.name for p in tmp_path.iterdir()] == [T.CURVES_FILE]  # no temporary left


# --------------------------------------------------------------------- fuseflow eval/bench

@pytest.mark.parametrize("optimizer,precision", [("sgd", "float32"), ("momentum", "float16"),
                                                 ("adam", "float16"), ("adamw", "float32")])
def test_cli_eval_prints_the_count_the_run_recorded(cli, tmp_path, optimizer, precision):
    out = tmp_path / "run"
    r = cli("train", "--dataset", "digits", "--hidden", "16", "--epochs", "1", "--no-progress",
            "--optimizer", optimizer, "--precision", precision, "--out", out)
    assert r.returncode == 0, r.stderr
    (rec,) = T.read_metrics(out)
    x, y = ff.data.digits("test")
    for batch in ("1000", "7"):
        e = cli("eval", out / T.LAST, "--batch-size", batch)
        assert e.returncode == 0, e.stderr
        lines = e.stdout.strip().splitlines()
        m = re.fullmatch(r"test_loss=(\S+) \((\d+)/(\d+) correct\)", lines[-2])
        assert m and int(m[3]) == len(y) and int(m[2]) / len(y) == rec["test_acc"]
        assert float(m[1]) == pytest.approx(rec["test_loss"], abs=5e-5)
        assert lines[-1] == f"test_accuracy={rec['test_acc']:.4f}"


def test_cli_bench_options_and_last_line(cli):
    r = cli("bench", "--hidden", "8,4", "--steps", "3", "--warmup", "1", "--batch-size", "5",
            "--input-width", "6", "--classes", "3", "--optimizer", "momentum",
            "--activation", "gelu", "--precision", "float16", "--backend", "numpy")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-2].startswith("model: 6 -> 8 -> 4 -> 3, batch 5, momentum, float16 (dynamic loss "
                                 "scaling); 3 steps")
    m = re.fullmatch(r"steps_per_s=([\d.]+) samples_per_s=(\d+) ms_per_step=([\d.]+)", lines[-1])
    assert m and float(m[1]) > 0
    assert float(m[3]) == pytest.approx(1e3 / float(m[1]), rel=0.02)
    assert int(m[2]) == pytest.approx(5 * float(m[1]), rel=0.02, abs=1)
    with pytest.raises(SystemExit) as e:
        cli("bench", "--steps", "0")
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli("bench", "--warmup", "-2")
    assert e.value.code == 2


def test_a_plot_that_cannot_be_written_warns_and_training_goes_on(rng, tmp_path):
    """curves.png is a picture of metrics.jsonl: a folder in its place used to stop the run
    after the first epoch's checkpoint; now it is a warning and every epoch is saved."""
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    opt = ff.optim.sgd(0.05)
    state = T.init_state(model, opt, (5,), ff.random.key(int(rng.integers(2**31))))
    x = rng.standard_normal((40, 5)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    def block_the_plot(st, metrics):  # a folder where the first epoch's plot goes
        (tmp_path / T.CURVES_FILE).mkdir(exist_ok=True)

    with pytest.warns(RuntimeWarning, match=r"fit: could not write .*curves\.png.*training "
                                            r"goes on.*Fix:"):
        r = T.fit(model, opt, state, (x, y), None, epochs=2, batch_size=10,
                  out_dir=tmp_path, progress=False, log=None, on_step=block_the_plot)
    assert r.state.epoch == 2 and (tmp_path / "ckpt-epoch2.safetensors").is_file()
    assert [q["epoch"] for q in T.read_metrics(tmp_path)] == [1, 2]
