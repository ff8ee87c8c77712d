"""fuseflow.train: the pure step, evaluation, fit, checkpoints, and exact resumption.

The resumption tests compare with ``np.array_equal`` and ``==`` on purpose: a resumed run
must be the uninterrupted run, not an approximation of it.
"""

from __future__ import annotations

import math
import os
import signal
import sys

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow import train as T
from fuseflow.losses import LossError


def _data():
    return ff.data.digits("train"), ff.data.digits("test")


def _model():
    # Dropout draws a key per step, so exactness also proves the layer keys are resumed.
    return nn.Serial(nn.Dense(32, "relu"), nn.Dropout(0.1), nn.Dense(10))


def _optimizer(epochs, steps_per_epoch):
    lr = ff.optim.cosine_decay_schedule(3e-3, epochs * steps_per_epoch)
    return ff.optim.adam(lr)


BATCH = 100
STEPS = 1438 // BATCH  # digits "train" has 1438 examples; drop_last keeps 14 batches


def _fresh(epochs=2, seed=0):
    model, opt = _model(), _optimizer(epochs, STEPS)
    return model, opt, T.init_state(model, opt, (64,), ff.random.key(seed))


def _fit(model, opt, state, train, test, epochs, out_dir=None, **kw):
    return T.fit(model, opt, state, train, test, epochs=epochs, batch_size=BATCH,
                 out_dir=out_dir, progress=False, log=None, **kw)


def _assert_trees_equal(a, b):
    la, lb = ff.tree.leaves(a), ff.tree.leaves(b)
    assert ff.tree.structure(a) == ff.tree.structure(b)
    for i, (x, y) in enumerate(zip(la, lb)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), f"leaf {i} differs"


def _losses(history):
    return [(r["epoch"], r["step"], r["train_loss"], r["train_acc"], r["test_loss"],
             r["test_acc"]) for r in history]


# ---------------------------------------------------------------------------------- step

def test_step_makes_the_loss_fall_and_returns_arrays():
    (x, y), _ = _data()
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10))
    opt = ff.optim.adam(1e-2)
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    step = T.make_step(model, ff.losses.softmax_cross_entropy, opt)
    params, opt_state = state.params, state.opt_state
    losses = []
    for i in range(40):
        xb, yb = x[i % 10 * 64:(i % 10 + 1) * 64], y[i % 10 * 64:(i % 10 + 1) * 64]
        params, opt_state, metrics = step(params, opt_state, xb, yb)
        losses.append(float(metrics["loss"]))
    # no host sync inside the step: metrics stay NumPy/CuPy values, not Python floats
    assert set(metrics) == {"loss", "accuracy"}
    assert all(isinstance(v, (np.ndarray, np.generic)) for v in metrics.values())
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert int(opt_state[0].count) == 40  # the optimizer counted every step


class _KeptBufferScale(nn.Layer):
    """A per-feature scale whose backward refills one gradient buffer it keeps."""

    def init(self, key, in_shape):
        self.buffer = np.zeros(in_shape, np.float32)
        return tuple(in_shape), {"g": np.linspace(0.5, 1.5, in_shape[0], dtype=np.float32)}

    def forward(self, params, x, *, key=None, train=True):
        return x * params["g"], ({"x": x} if train else {})

    def backward(self, params, residuals, dy):
        np.sum(dy * residuals["x"], axis=0, out=self.buffer)
        return {"g": self.buffer}, dy * params["g"]


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_step_never_makes_a_layers_kept_gradient_buffer_the_new_params(optimizer):
    """make_step lets the update write the new params into the gradients only when every
    layer is fuseflow's own: a layer of the user's may refill the same buffer each step."""
    (x, y), _ = _data()
    model = nn.Serial(nn.Dense(16, "relu"), _KeptBufferScale(), nn.Dense(10))
    opt = {"sgd": ff.optim.sgd(0.1), "momentum": ff.optim.sgd(0.05, momentum=0.9),
           "adam": ff.optim.adam(1e-2)}[optimizer]
    _, params = model.init(ff.random.key(0), (64,))
    state = opt.init(params)
    ref_p, ref_s = params, state
    step = T.make_step(model, ff.losses.softmax_cross_entropy, opt)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    for i in range(3):
        xb, yb = x[i * 50:(i + 1) * 50], y[i * 50:(i + 1) * 50]
        params, state, _ = step(params, state, xb, yb)
        _, grads = grad_fn(ref_p, xb, yb)
        updates, ref_s = opt.update(ff.tree.map(np.copy, grads), ref_s, ref_p)
        ref_p = ff.optim.apply_updates(ref_p, updates)
        _assert_trees_equal(params, ref_p)
    assert T._step._own_layers_only(nn.Serial(nn.Dense(4), nn.ReLU(), nn.Dropout(0.1)))
    assert not T._step._own_layers_only(model)


def test_step_leaves_its_inputs_alone():
    (x, y), _ = _data()
    model, opt, state = _fresh()
    before = ff.tree.map(np.copy, state.params)
    T.make_step(model, ff.losses.softmax_cross_entropy, opt)(state.params, state.opt_state,
                                                             x[:32], y[:32],
                                                             key=ff.random.key(1))
    _assert_trees_equal(before, state.params)


# ---------------------------------------------------------------------------- evaluate

def test_evaluate_counts_exactly_and_ignores_batch_size():
    _, (xt, yt) = _data()
    model, _, state = _fresh()
    a = T.evaluate(model, state.params, xt, yt, 1000)
    b = T.evaluate(model, state.params, xt, yt, 7)
    logits = model.apply(state.params, xt)
    assert a.count == len(yt) and a.correct == int((logits.argmax(1) == yt).sum())
    assert a.accuracy == a.correct / a.count
    assert (a.correct, a.accuracy) == (b.correct, b.accuracy)
    assert a.loss == pytest.approx(float(ff.losses.softmax_cross_entropy(logits, yt)[0]),
                                   rel=1e-5)


def test_labels_out_of_range_are_reported_once_with_the_fix():
    (x, y), _ = _data()
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(5))  # 5 outputs, 10 classes
    opt = ff.optim.adam(1e-3)
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    with pytest.raises(LossError, match=r"labels lie in \[0, 9\].*5 outputs.*10 features"):
        _fit(model, opt, state, (x, y), None, epochs=1)
    with pytest.raises(LossError, match="1-D integer"):
        T.evaluate(model, state.params, x, y.astype(np.float32), 100)


# --------------------------------------------------------------------------------- fit

def test_fit_writes_metrics_curves_and_checkpoints(tmp_path):
    train, test = _data()
    model, opt, state = _fresh()
    result = _fit(model, opt, state, train, test, 2, tmp_path, metadata={"note": "x"})
    assert result.state.epoch == 2 and result.state.step == 2 * STEPS
    assert result.state.batch_in_epoch == 0
    records = T.read_metrics(tmp_path / T.METRICS_FILE)
    assert [r["epoch"] for r in records] == [1, 2]
    assert all(set(r) == set(T.FIELDS) for r in records)
    assert records == result.history
    assert records[-1]["test_acc"] == result.test.accuracy
    assert records[-1]["samples_per_s"] > 0 and records[-1]["seconds"] > 0
    assert (tmp_path / T.CURVES_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-epoch1.safetensors", "ckpt-epoch2.safetensors", "curves.png",
                     "last.safetensors", "metrics.jsonl"]  # no temporary files left over
    meta = ff.checkpoint.read_metadata(tmp_path / T.LAST)
    assert meta["note"] == "x" and meta["metrics"] == records[-1]
    epoch1 = T.load_state(tmp_path / "ckpt-epoch1.safetensors", like=state)
    assert (epoch1.epoch, epoch1.step, epoch1.batch_in_epoch) == (1, STEPS, 0)


def test_fit_keeps_no_earlier_state_alive(tmp_path):
    """Memory: once a step has replaced them, the params and moments that fit was given (and
    those an epoch started from) are freed; for Adam each state is three copies of the
    params. The caller hands its only reference over, as the command line does."""
    import gc
    import weakref

    train, test = _data()
    model, opt, state = _fresh(epochs=2)
    refs = {"given": [weakref.ref(a) for a in ff.tree.leaves((state.params, state.opt_state))
                      if isinstance(a, np.ndarray) and a.size > 1]}
    held, state = [state], None
    alive = []

    def on_step(s, metrics):
        if s.batch_in_epoch == STEPS:  # the epoch's last state: the next one starts from it
            refs[s.epoch] = [weakref.ref(a) for a in ff.tree.leaves((s.params, s.opt_state))
                             if isinstance(a, np.ndarray) and a.size > 1]
        if s.batch_in_epoch == 3:
            gc.collect()
            alive.append({k: sum(r() is not None for r in v) for k, v in refs.items()})

    T.fit(model, opt, held.pop(), train, test, epochs=2, batch_size=BATCH, out_dir=tmp_path,
          on_step=on_step, progress=False, log=None)  # not _fit: its frame would hold state
    if sys.version_info < (3, 11):  # the caller keeps a call's arguments until it returns
        alive = [{k: n for k, n in a.items() if k != "given"} for a in alive]
        assert alive == [{}, {0: 0}]
    else:
        assert alive == [{"given": 0}, {"given": 0, 0: 0}]
    assert len(refs["given"]) == 3 * 4  # params, mu and nu of two Dense layers


def test_checkpoint_holds_the_whole_state(tmp_path):
    train, test = _data()
    model, opt, state = _fresh()
    result = _fit(model, opt, state, train, test, 1, tmp_path)
    loaded = T.load_state(tmp_path / T.LAST, like=state)
    assert isinstance(loaded, T.TrainState)
    assert isinstance(loaded.step, int) and isinstance(loaded.epoch, int)
    _assert_trees_equal(loaded, result.state)


def test_eval_of_the_saved_checkpoint_agrees_with_fit(tmp_path):
    train, test = _data()
    model, opt, state = _fresh()
    result = _fit(model, opt, state, train, test, 2, tmp_path)
    loaded = T.load_state(tmp_path / T.LAST, like=state)
    again = T.evaluate(model, loaded.params, *test, 1000)
    assert again == result.test


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    train, test = _data()
    model, opt, state = _fresh(epochs=2)
    straight = _fit(model, opt, state, train, test, 2, tmp_path / "straight")

    first = _fit(model, opt, state, train, test, 1, tmp_path / "resumed")
    assert first.state.epoch == 1
    like = T.init_state(model, opt, (64,), ff.random.key(123))  # any key: only the shape counts
    resumed_state = T.load_state(tmp_path / "resumed" / T.LAST, like=like)
    second = _fit(model, opt, resumed_state, train, test, 2, tmp_path / "resumed")

    assert _losses(second.history) == _losses(straight.history)
    assert second.history[0] == first.history[0]  # the first epoch's line was kept
    _assert_trees_equal(second.state, straight.state)
    assert second.test == straight.test
    assert (T.read_metrics(tmp_path / "resumed" / T.METRICS_FILE)[-1]["train_loss"]
            == straight.history[-1]["train_loss"])


def test_compiled_fit_equals_the_plain_loop_and_derives_no_step_keys(monkeypatch):
    """fit(compiled=True) (on NumPy a pass-through of ff.compile) trains exactly as the
    plain loop; its step takes no key, so the loop derives none per step."""
    train, test = _data()
    model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(10))  # no Dropout: no keys
    opt = _optimizer(1, STEPS)
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    plain = _fit(model, opt, state, train, test, 1)
    calls = []
    fold_in = ff.random.fold_in
    monkeypatch.setattr(ff.random, "fold_in", lambda *a: calls.append(a) or fold_in(*a))
    compiled = _fit(model, opt, state, train, test, 1, compiled=True)
    assert len(calls) == 1  # the epoch's data order only
    assert _losses(compiled.history) == _losses(plain.history)
    _assert_trees_equal(compiled.state, plain.state)


@pytest.mark.gpu
def test_compiled_fit_on_the_gpu_matches_the_eager_loop():
    """On a GPU, fit(compiled=True) (the epoch's loss and accuracy sums added inside the
    graph, batches sliced from one gather per epoch) records the losses of the eager loop
    and of its own steps."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    train, test = _data()
    model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(10))
    opt = _optimizer(2, STEPS)
    state = T.init_state(model, opt, (64,), ff.random.key(0))
    state = state._replace(params=ff.device_put(state.params, "cuda"),
                           opt_state=ff.device_put(state.opt_state, "cuda"))
    per_step = []
    eager = _fit(model, opt, state, train, test, 2)
    compiled = _fit(model, opt, state, train, test, 2, compiled=True,
                    on_step=lambda st, m: per_step.append((float(m["loss"]),
                                                           float(m["accuracy"]))))
    for a, b in zip(compiled.history, eager.history):
        for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    first = np.array(per_step[:STEPS])
    assert compiled.history[0]["train_loss"] == pytest.approx(first[:, 0].mean(), rel=1e-6)
    assert compiled.history[0]["train_acc"] == pytest.approx(first[:, 1].mean(), rel=1e-6)
    assert compiled.history[1]["train_loss"] < compiled.history[0]["train_loss"]


def test_resume_mid_epoch_reproduces_the_parameters_exactly(tmp_path):
    train, test = _data()
    model, opt, state = _fresh(epochs=2)
    straight = _fit(model, opt, state, train, None, 2)

    def save_and_stop(st, metrics):
        if st.step == STEPS + 5:  # five batches into the second epoch
            T.save_state(tmp_path / "mid.safetensors", st)
            raise KeyboardInterrupt

    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, None, 2, on_step=save_and_stop)
    mid = T.load_state(tmp_path / "mid.safetensors", like=state)
    assert (mid.epoch, mid.batch_in_epoch, mid.step) == (1, 5, STEPS + 5)
    resumed = _fit(model, opt, mid, train, None, 2)
    _assert_trees_equal(resumed.state, straight.state)


def test_resume_mid_epoch_records_the_steps_taken_after_the_resume(tmp_path):
    """The state carries no running sums: the resumed epoch's record is the mean over the
    steps run after the resume (as fit's docstring says), the next epoch's is whole."""
    train, _ = _data()
    model, opt, state = _fresh(epochs=3)
    losses = []
    straight = _fit(model, opt, state, train, None, 3,
                    on_step=lambda st, m: losses.append(float(m["loss"]) * BATCH))

    def save_and_stop(st, metrics):
        if st.step == STEPS + 5:
            T.save_state(tmp_path / "mid.safetensors", st)
            raise KeyboardInterrupt

    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, None, 3, on_step=save_and_stop)
    resumed = _fit(model, opt, T.load_state(tmp_path / "mid.safetensors", like=state), train,
                   None, 3)
    partial, whole = resumed.history
    assert partial["train_loss"] == pytest.approx(
        sum(losses[STEPS + 5:2 * STEPS]) / ((STEPS - 5) * BATCH), rel=1e-6)
    assert whole == {**straight.history[2], "seconds": whole["seconds"],
                     "samples_per_s": whole["samples_per_s"]}


@pytest.mark.parametrize("in_place", [False, True])
def test_resume_from_a_state_saved_after_the_epochs_last_step(tmp_path, in_place):
    """on_step hands out the state after the epoch's last step before the epoch closes
    (batch_in_epoch == steps per epoch): resumed, that epoch closes with no step (evaluated,
    saved, recorded with train_loss None) and the run goes on, bit for bit."""
    train, test = _data()
    model, opt, state = _fresh(epochs=2)
    straight = _fit(model, opt, state, train, test, 2)
    out = tmp_path / "run" if in_place else None

    def save_and_stop(st, metrics):
        if st.step == STEPS:
            T.save_state((out or tmp_path) / T.LAST, st)
            raise KeyboardInterrupt

    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, test, 2, out, on_step=save_and_stop)
    end = T.load_state((out or tmp_path) / T.LAST, like=state)
    assert (end.epoch, end.batch_in_epoch) == (0, STEPS)
    resumed = _fit(model, opt, end, train, test, 2, out)
    _assert_trees_equal(resumed.state, straight.state)
    first, second = resumed.history
    assert first["train_loss"] is None and first["test_acc"] == straight.history[0]["test_acc"]
    assert second["train_loss"] == straight.history[1]["train_loss"]
    if in_place:
        assert [r["epoch"] for r in T.read_metrics(out)] == [1, 2]


def test_a_mid_epoch_state_beyond_this_epochs_batches_is_named():
    train, _ = _data()
    model, opt, state = _fresh()
    with pytest.raises(ValueError, match=r"fit: the state is at batch 10 of epoch 1, but 1438 "
                                         r"training examples make 7 batches of 200 .*Fix: "):
        T.fit(model, opt, state._replace(batch_in_epoch=10), train, epochs=1,
              batch_size=200, progress=False, log=None)


@pytest.mark.parametrize("call, match", [
    (lambda m, o, s, tr: T.fit(m, o, s, tr, epochs=1, batch_size=0, log=None),
     "fit: batch_size must be a positive int, got 0"),
    (lambda m, o, s, tr: T.fit(m, o, s, tr, epochs=1, batch_size=100, log_every=0, log=None),
     "fit: log_every must be a positive int, got 0"),
    (lambda m, o, s, tr: T.evaluate(m, s.params, *tr, batch_size=0),
     "evaluate: batch_size must be a positive int, got 0"),
], ids=["fit_batch_size", "log_every", "evaluate_batch_size"])
def test_batch_sizes_and_log_every_are_checked_where_given(call, match):
    train, _ = _data()
    model, opt, state = _fresh()
    with pytest.raises(ValueError, match=match):
        call(model, opt, state, train)


def test_ctrl_c_keeps_the_last_full_checkpoint(tmp_path):
    train, test = _data()
    model, opt, state = _fresh(epochs=3)

    def interrupt(st, metrics):
        if st.step == STEPS + 3:  # in the second epoch
            raise KeyboardInterrupt

    with pytest.raises(T.Interrupted) as info:
        _fit(model, opt, state, train, test, 3, tmp_path, on_step=interrupt)
    assert isinstance(info.value, KeyboardInterrupt)
    assert info.value.checkpoint == tmp_path / T.LAST and info.value.epoch == 1
    kept = T.load_state(info.value.checkpoint, like=state)
    assert (kept.epoch, kept.step, kept.batch_in_epoch) == (1, STEPS, 0)
    assert [r["epoch"] for r in T.read_metrics(tmp_path / T.METRICS_FILE)] == [1]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half files

    # ... and the run goes on from it as if nothing had happened
    straight = _fit(model, opt, state, train, test, 3)
    resumed = _fit(model, opt, kept, train, test, 3, tmp_path)
    _assert_trees_equal(resumed.state, straight.state)
    assert _losses(T.read_metrics(tmp_path / T.METRICS_FILE)) == _losses(straight.history)


def test_ctrl_c_before_the_first_checkpoint_reports_none():
    train, test = _data()
    model, opt, state = _fresh()

    def interrupt(st, metrics):
        raise KeyboardInterrupt

    with pytest.raises(T.Interrupted) as info:
        _fit(model, opt, state, train, test, 2, on_step=interrupt)
    assert info.value.checkpoint is None and info.value.epoch == 0


@pytest.fixture
def sigint(request):
    """SIGINT set to ``request.param`` for the test (pytest may run with it ignored, as
    under nohup), restored afterwards."""
    previous = signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_ctrl_c_while_saving_waits_for_the_files(sigint):
    from fuseflow.train._signals import hold_interrupts

    done = []
    with pytest.raises(KeyboardInterrupt):
        with hold_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("wrote both files")
    assert done == ["wrote both files"]
    assert signal.getsignal(signal.SIGINT) is sigint


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_a_process_that_ignores_ctrl_c_goes_on_ignoring_it(sigint):
    """Under nohup (SIGINT ignored) neither the save nor the training loop takes SIGINT
    over: a Ctrl-C there changes nothing."""
    from fuseflow.train._signals import hold_interrupts, interrupt_between_steps

    with hold_interrupts():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)
    with interrupt_between_steps() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        stop.check()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_sigterm_during_fit_stops_after_the_step_and_keeps_the_last_checkpoint(tmp_path):
    """SIGTERM (``kill``, a scheduler's preemption) stops like Ctrl-C, and says so."""
    train, test = _data()
    model, opt, state = _fresh(epochs=3)

    def terminate(st, metrics):
        if st.step == STEPS + 3:  # in the second epoch
            # if fit had not taken SIGTERM over, the kill below would end pytest itself
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(T.Interrupted) as info:
        _fit(model, opt, state, train, test, 3, tmp_path, on_step=terminate)
    assert info.value.signum == signal.SIGTERM
    assert info.value.checkpoint == tmp_path / T.LAST and info.value.epoch == 1
    kept = T.load_state(info.value.checkpoint, like=state)
    assert (kept.epoch, kept.step) == (1, STEPS)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_a_signal_during_a_save_ends_the_epoch_normally_then_stops(tmp_path, monkeypatch):
    """The epoch's curves and log line still come; the run stops after it."""
    from fuseflow.train import _fit as F

    train, test = _data()
    model, opt, state = _fresh(epochs=3)
    save, saved = F.save_state, []

    def save_state(path, st, metadata):
        save(path, st, metadata)
        saved.append(path)
        if len(saved) == 1:  # epoch 1's checkpoint written, last.safetensors not yet
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(F, "save_state", save_state)
    lines = []
    with pytest.raises(T.Interrupted) as info:
        T.fit(model, opt, state, train, test, epochs=3, batch_size=BATCH, out_dir=tmp_path,
              progress=False, log=lines.append)
    assert info.value.signum == signal.SIGTERM and info.value.epoch == 1
    assert len(lines) == 1 and lines[0].startswith("epoch 1/3")
    assert (tmp_path / T.CURVES_FILE).is_file()
    assert [r["epoch"] for r in T.read_metrics(tmp_path / T.METRICS_FILE)] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-epoch1.safetensors", "curves.png", "last.safetensors", "metrics.jsonl"]


@pytest.mark.parametrize("fails", ["checkpoint", "last"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_save_that_fails_half_way_leaves_records_and_checkpoints_that_agree(
        tmp_path, monkeypatch, fails, overwrite):
    """A write error (disk full) in epoch 3's save, continuing a 2-epoch run in its folder
    or replacing a 5-epoch one (overwrite): the folder's latest checkpoint and its records
    still agree, and the run goes on from there to the same end as one never stopped."""
    from fuseflow.train import _fit as F

    train, test = _data()
    model, opt, state = _fresh(epochs=5)
    straight = _fit(model, opt, state, train, test, 5)
    _fit(model, opt, state, train, test, 5 if overwrite else 2, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    start = T.load_state(tmp_path / "ckpt-epoch2.safetensors", like=state)
    save = F.save_state

    def save_state(path, st, metadata):
        if st.epoch == 3 and (path.name == T.LAST) == (fails == "last"):
            raise OSError(28, "No space left on device")
        save(path, st, metadata)

    monkeypatch.setattr(F, "save_state", save_state)
    with pytest.raises(OSError, match="No space left"):
        _fit(model, opt, start, train, test, 5, tmp_path, overwrite=overwrite)
    monkeypatch.undo()
    latest = T._run_folder.latest_checkpoint(tmp_path)
    if overwrite and fails == "checkpoint":  # the new run saved nothing: the old is whole
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
        return
    resumed = T.load_state(latest, like=state)
    assert resumed.epoch == (3 if fails == "last" else 2)
    if overwrite:  # the old run's later checkpoints went with the new epoch 3
        assert not (tmp_path / "ckpt-epoch4.safetensors").exists()
    if fails == "checkpoint":  # epoch 3's record has no checkpoint: it is not cut unasked
        with pytest.raises(FileExistsError, match="holds metrics.jsonl"):
            _fit(model, opt, resumed, train, test, 5, tmp_path)
    done = _fit(model, opt, resumed, train, test, 5, tmp_path, overwrite=fails == "checkpoint")
    records = T.read_metrics(tmp_path / T.METRICS_FILE)
    assert records == done.history and _losses(records) == _losses(straight.history)


def test_a_diverged_run_is_still_its_own_run(tmp_path):
    """NaN in the state: the bitwise comparison still recognises the run's own folder (the
    run trains on through NaN only when asked: by default it stops, test_run_guards.py)."""
    train, test = _data()
    model, opt, state = _fresh(epochs=3)
    done = _fit(model, opt, state, train, test, 1, tmp_path)
    params = ff.tree.map(lambda w: np.full_like(w, np.nan), done.state.params)
    T.save_state(tmp_path / T.LAST, done.state._replace(params=params))
    nan_state = T.load_state(tmp_path / T.LAST, like=state)
    assert _fit(model, opt, nan_state, train, test, 2, tmp_path,
                stop_on_nonfinite=False).state.epoch == 2


def test_sigterm_while_saving_waits_for_the_files_and_a_second_one_is_not_lost():
    from fuseflow.train._signals import StopSignal, hold_interrupts, interrupt_between_steps

    done = []
    with interrupt_between_steps() as stop:
        with pytest.raises(StopSignal) as info:
            with hold_interrupts():
                assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("wrote both files")
        assert info.value.signum == signal.SIGTERM and done == ["wrote both files"]
        stop.check()  # nothing pending: the held signals were raised above
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_handler_of_the_users_stays_in_charge():
    from fuseflow.train._signals import interrupt_between_steps

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with interrupt_between_steps() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            stop.check()  # not a stop request: the user's handler took the signal
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_fit_rejects_what_cannot_run():
    train, test = _data()
    model, opt, state = _fresh()
    with pytest.raises(ValueError, match="no batch of 5000"):
        T.fit(model, opt, state, train, test, epochs=1, batch_size=5000, log=None)
    with pytest.raises(ValueError, match="already completed 2 epochs"):
        T.fit(model, opt, state._replace(epoch=2), train, test, epochs=1, batch_size=BATCH)
    with pytest.raises(TypeError, match="init_state"):
        T.fit(model, opt, state.params, train, test, epochs=1, batch_size=BATCH)


def test_a_finished_run_resumed_only_evaluates(tmp_path):
    train, test = _data()
    model, opt, state = _fresh()
    done = _fit(model, opt, state, train, test, 1, tmp_path)
    again = _fit(model, opt, done.state, train, test, 1, tmp_path)
    assert again.test == done.test and again.state.step == done.state.step
    assert len(T.read_metrics(tmp_path / T.METRICS_FILE)) == 1


def test_fit_never_overwrites_saved_epochs_unless_asked(tmp_path):
    """A fresh run, or a resumed one, into a folder holding later epochs raises before
    training and leaves every file as it was; overwrite=True replaces them."""
    train, test = _data()
    model, opt, state = _fresh()
    _fit(model, opt, state, train, test, 2, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match=r"ckpt-epoch1\.safetensors, ckpt-epoch2"
                       r"\.safetensors, last\.safetensors, metrics\.jsonl, curves\.png, which "
                       r"a run from epoch 0 would overwrite\. Fix: out_dir=NEW_DIR") as info:
        _fit(model, opt, state, train, test, 2, tmp_path)
    # the resume fix is a call that runs: load_state needs the template state, and the path
    # is a Python literal (quotes or backslashes in it are escaped)
    assert f"ff.train.load_state({str(tmp_path / 'last.safetensors')!r}, like=state)" in str(
        info.value)
    epoch1 = T.load_state(tmp_path / "ckpt-epoch1.safetensors", like=state)
    with pytest.raises(FileExistsError, match=r"holds ckpt-epoch2\.safetensors, "
                       r"last\.safetensors, metrics\.jsonl, which a run continuing after "
                       r"epoch 1 would overwrite"):
        _fit(model, opt, epoch1, train, test, 2, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    again = _fit(model, opt, epoch1, train, test, 2, tmp_path, overwrite=True)
    assert [r["epoch"] for r in T.read_metrics(tmp_path / T.METRICS_FILE)] == [1, 2]
    assert again.history[-1]["train_loss"] == T.read_metrics(
        tmp_path / T.METRICS_FILE)[-1]["train_loss"]
    # a folder without last.safetensors: no resume call is offered
    other = tmp_path.parent / f"{tmp_path.name}-metrics-only"
    other.mkdir()
    (other / T.METRICS_FILE).write_text("{}\n")
    with pytest.raises(FileExistsError, match="Fix: out_dir=NEW_DIR, or overwrite=True"):
        _fit(model, opt, state, train, test, 1, other)


def test_a_run_of_the_same_seed_but_another_model_is_another_run(tmp_path):
    train, test = _data()
    model, opt, state = _fresh()
    _fit(model, opt, state, train, test, 1, tmp_path)
    wide = ff.nn.Serial(ff.nn.Dense(64, "relu"), ff.nn.Dense(10))
    other = T.init_state(wide, opt, (64,), ff.random.key(0))  # the same seed, data keys
    first = _fit(wide, opt, other, train, test, 1)
    with pytest.raises(FileExistsError, match="continuing after epoch 1 would overwrite"):
        _fit(wide, opt, first.state, train, test, 2, tmp_path)


def test_fit_refuses_another_runs_folder_whatever_its_epochs(tmp_path):
    """A state resumed from elsewhere at an epoch past every file of the folder's own run
    would leave two runs' files mixed: refused too."""
    train, test = _data()
    model, opt, state = _fresh(epochs=4)
    _fit(model, opt, state, train, test, 2, tmp_path / "x")
    other = _fit(model, opt, _fresh(epochs=4, seed=1)[2], train, test, 3, tmp_path / "y")
    with pytest.raises(FileExistsError, match="ckpt-epoch1.*ckpt-epoch2.*which a run "
                       "continuing after epoch 3 would overwrite"):
        _fit(model, opt, other.state, train, test, 4, tmp_path / "x")


def test_overwrite_deletes_the_old_later_epochs_once_it_has_saved_one(tmp_path):
    """A shorter run over a longer one leaves no checkpoint of the old run behind, so the
    new run resumes from its own files."""
    train, test = _data()
    model, opt, state = _fresh(epochs=3)
    _fit(model, opt, state, train, test, 3, tmp_path)
    short = _fit(model, opt, _fresh(epochs=3, seed=1)[2], train, test, 1, tmp_path,
                 overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-epoch1.safetensors", "curves.png", "last.safetensors", "metrics.jsonl"]
    assert T.read_metrics(tmp_path / T.METRICS_FILE) == short.history
    resumed = T.load_state(tmp_path / T.LAST, like=state)
    assert _fit(model, opt, resumed, train, test, 2, tmp_path).state.epoch == 2


def test_overwrite_over_another_runs_folder_leaves_only_this_run(tmp_path):
    """A resumed state written over another run's folder: the other run's checkpoints and
    records go once an epoch is saved, and the history given is the new record's start."""
    train, test = _data()
    model, opt, state = _fresh(epochs=4)
    _fit(model, opt, _fresh(epochs=4, seed=1)[2], train, test, 4, tmp_path / "other")
    mine = _fit(model, opt, state, train, test, 2, tmp_path / "mine")
    result = _fit(model, opt, mine.state, train, test, 3, tmp_path / "other", overwrite=True,
                  history=mine.history)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == [
        "ckpt-epoch3.safetensors", "curves.png", "last.safetensors", "metrics.jsonl"]
    records = T.read_metrics(tmp_path / "other" / T.METRICS_FILE)
    assert records == result.history and records[:2] == mine.history
    assert [r["epoch"] for r in records] == [1, 2, 3]


def test_overwrite_touches_nothing_until_an_epoch_is_saved(tmp_path):
    train, test = _data()
    model, opt, state = _fresh(epochs=3)
    _fit(model, opt, state, train, test, 3, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    epoch1 = T.load_state(tmp_path / "ckpt-epoch1.safetensors", like=state)

    def stop(st, metrics):
        raise KeyboardInterrupt

    with pytest.raises(T.Interrupted):
        _fit(model, opt, epoch1, train, test, 3, tmp_path, overwrite=True, on_step=stop)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_mid_epoch_state_resumes_in_its_own_folder(tmp_path):
    """A state saved by hand in the middle of epoch 0 as last.safetensors continues there."""
    train, test = _data()
    model, opt, state = _fresh()

    def save_and_stop(st, metrics):
        if st.step == 5:
            T.save_state(tmp_path / T.LAST, st)
            raise KeyboardInterrupt

    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, test, 2, on_step=save_and_stop)
    mid = T.load_state(tmp_path / T.LAST, like=state)
    assert (mid.epoch, mid.batch_in_epoch) == (0, 5)
    assert _fit(model, opt, mid, train, test, 1, tmp_path).state.epoch == 1


def _save_and_stop_in_epoch_2(path):
    """An on_step that saves the state to ``path`` after batch 3 of epoch 2, then stops."""
    def save_and_stop(st, metrics):
        if st.epoch == 1 and st.batch_in_epoch == 3:
            T.save_state(path, st)
            raise KeyboardInterrupt
    return save_and_stop


def test_a_mid_epoch_state_saved_as_the_folders_last_continues_there(tmp_path):
    """A state saved from on_step in the middle of epoch 2 as the run folder's
    last.safetensors continues the run there: the folder's epoch-1 files and record are
    kept, and the result is the uninterrupted run's, bit for bit."""
    train, test = _data()
    model, opt, state = _fresh()
    whole = _fit(model, opt, state, train, test, 2, tmp_path / "whole")
    out = tmp_path / "run"
    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, test, 2, out,
             on_step=_save_and_stop_in_epoch_2(out / T.LAST))
    epoch1 = (out / "ckpt-epoch1.safetensors").read_bytes()
    mid = T.load_state(out / T.LAST, like=state)
    resumed = _fit(model, opt, mid, train, test, 2, out)
    _assert_trees_equal(resumed.state, whole.state)
    assert (out / "ckpt-epoch1.safetensors").read_bytes() == epoch1
    records = T.read_metrics(out / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[0] == T.read_metrics(tmp_path / "whole" / "metrics.jsonl")[0] | {
        "seconds": records[0]["seconds"], "samples_per_s": records[0]["samples_per_s"]}


def test_a_mid_epoch_state_saved_elsewhere_is_refused_with_the_way_on(tmp_path):
    """The same state saved outside the folder (or under another name in it) matches none of
    its checkpoints: fit refuses before touching anything and says how to continue (save it
    as the folder's last.safetensors, or a new out_dir with history=)."""
    train, test = _data()
    model, opt, state = _fresh()
    out = tmp_path / "run"
    with pytest.raises(T.Interrupted):
        _fit(model, opt, state, train, test, 2, out,
             on_step=_save_and_stop_in_epoch_2(tmp_path / "mid.safetensors"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    mid = T.load_state(tmp_path / "mid.safetensors", like=state)
    with pytest.raises(FileExistsError, match=r"in the middle of epoch 2.*save_state\(.*"
                                              r"last\.safetensors.*history=ff\.train\."
                                              r"read_metrics"):
        _fit(model, opt, mid, train, test, 2, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_another_runs_mid_epoch_state_copied_into_a_folder_does_not_claim_it(tmp_path):
    """Run B's mid-epoch state copied into run A's folder holds B, but the folder's epoch-1
    checkpoint is A's (other keys): the folder stays A's, so B is refused, and with
    overwrite=True it replaces all of A's files instead of continuing after A's epoch 1."""
    train, test = _data()
    model, opt, state_a = _fresh(seed=0)
    _, _, state_b = _fresh(seed=1)
    out = tmp_path / "a"
    _fit(model, opt, state_a, train, test, 2, out)
    with pytest.raises(T.Interrupted):
        _fit(model, opt, state_b, train, test, 2, tmp_path / "b",
             on_step=_save_and_stop_in_epoch_2(out / "theirs.safetensors"))
    mid_b = T.load_state(out / "theirs.safetensors", like=state_b)
    with pytest.raises(FileExistsError, match=r"ckpt-epoch1.safetensors, ckpt-epoch2"):
        _fit(model, opt, mid_b, train, test, 2, out)
    _fit(model, opt, mid_b, train, test, 2, out, overwrite=True)
    # A's epoch 1 is not B's: gone, not kept beside B's epoch 2
    assert sorted(p.name for p in out.glob("ckpt-*")) == ["ckpt-epoch2.safetensors"]
    assert [r["epoch"] for r in T.read_metrics(out / "metrics.jsonl")] == [2]


@pytest.mark.parametrize("metadata", [None, {"metrics": {"note": "no epoch here"}}])
def test_a_checkpoint_saved_by_hand_is_the_runs_own_epoch(tmp_path, metadata):
    """last.safetensors written by save_state (no metrics in its metadata) is read for its
    epoch, not taken for a later one."""
    train, test = _data()
    model, opt, state = _fresh(epochs=3)
    done = _fit(model, opt, state, train, test, 2, tmp_path)
    T.save_state(tmp_path / T.LAST, done.state, metadata)
    resumed = T.load_state(tmp_path / T.LAST, like=state)
    assert _fit(model, opt, resumed, train, test, 3, tmp_path).state.epoch == 3


# ------------------------------------------------------------------------------ recipe

def test_recipe_round_trips_and_rebuilds_the_model():
    r = T.Recipe("digits", None, 64, 10, hidden=(16, 8), activation="gelu",
                 optimizer="adamw", weight_decay=1e-3)
    again = T.Recipe.from_metadata(r.to_metadata())
    assert again == r
    model = again.model()
    assert [type(layer).__name__ for layer in model.layers] == ["Dense"] * 3
    assert [layer.features for layer in model.layers] == [16, 8, 10]
    assert model.layers[0].activation == "gelu" and model.layers[-1].activation is None


def test_recipe_errors_name_the_fix():
    with pytest.raises(T.RecipeError, match="--optimizer adamw"):
        T.Recipe("digits", None, 64, 10, optimizer="adam", weight_decay=0.1)
    with pytest.raises(T.RecipeError, match="not written by `fuseflow train`") as info:
        T.Recipe.from_metadata({"note": "something else"})
    # the fix covers both evaluating and resuming such a run from Python
    assert "ff.train.load_state(path, like=" in str(info.value)
    assert "ff.train.fit(model, opt, state" in str(info.value)
    with pytest.raises(T.RecipeError, match="newer fuseflow"):
        T.Recipe.from_metadata(dict(T.Recipe("digits", None, 64, 10).to_metadata(), x=1))


def test_adamw_recipe_decays_weights_not_biases():
    r = T.Recipe("digits", None, 4, 2, hidden=(3,), optimizer="adamw", lr=0.1,
                 weight_decay=0.5, schedule="constant")
    model, opt = r.model(), r.optimizer_for(1)
    _, params = model.init(ff.random.key(0), (4,))
    zero = ff.tree.zeros_like(params)
    updates, _ = opt.update(zero, opt.init(params), params)
    assert np.allclose(updates[0]["w"], -0.1 * 0.5 * params[0]["w"])
    assert np.all(updates[0]["b"] == 0)


def test_float16_step_keeps_float32_params_and_needs_loss_scaling():
    (x, y), _ = _data()
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dense(10))
    plain = ff.optim.adam(1e-2)
    state = T.init_state(model, plain, (64,), ff.random.key(0))
    step = T.make_step(model, ff.losses.softmax_cross_entropy, plain, compute_dtype="float16")
    with pytest.raises(TypeError, match="dynamic_loss_scaling"):
        step(state.params, state.opt_state, x[:64], y[:64])

    scaled = ff.mixed_precision.dynamic_loss_scaling(plain)
    state = T.init_state(model, scaled, (64,), ff.random.key(0))
    step = T.make_step(model, ff.losses.softmax_cross_entropy, scaled, compute_dtype="float16")
    params, opt_state = state.params, state.opt_state
    first = None
    for i in range(30):
        params, opt_state, m = step(params, opt_state, x[i % 10 * 64:(i % 10 + 1) * 64],
                                    y[i % 10 * 64:(i % 10 + 1) * 64])
        first = first if first is not None else float(m["loss"])
    assert all(p.dtype == np.float32 for p in ff.tree.leaves(params))
    assert float(m["loss"]) < 0.5 * first


def test_fit_checks_its_data_before_the_first_step(tmp_path):
    """Bad data fails at the call, not after an epoch of training (and nothing is saved)."""
    (x, y), test = _data()
    model, opt, state = _fresh()
    cases = [
        (dict(test=(test[0][:0], test[1][:0])), ValueError, "the test set is empty"),
        (dict(eval_batch_size=0), ValueError, "eval_batch_size must be a positive int"),
        (dict(train=(x[:0], y[:0])), ValueError, "the training set is empty"),
        (dict(train=(x, y, y)), TypeError, r"train must be an \(x, y\) pair of arrays .* got "
                                           "a tuple of 3"),
        (dict(test=test[0]), TypeError, r"test must be an \(x, y\) pair .* got a ndarray"),
    ]
    nan_x = x.copy()
    nan_x[7, 3] = np.nan
    cases.append((dict(train=(nan_x, y)), ValueError, "train inputs hold NaN or inf "
                                                      r"\(first in example 7\)"))
    cases.append((dict(train=(x.tolist(), y)), TypeError, "a pair whose x is a list, not an "
                                                          "array"))
    for kw, exc, says in cases:
        args = {"train": (x, y), "test": test, **kw}
        with pytest.raises(exc, match=says):
            _fit(model, opt, state, args.pop("train"), args.pop("test"), 1, tmp_path, **args)
    assert not any(tmp_path.iterdir())


def test_fit_names_negative_labels_and_a_state_loaded_without_like(tmp_path):
    (x, y), test = _data()
    model, opt, state = _fresh()
    with pytest.raises(ff.losses.LossError, match=r"labels lie in \[-1, 8\], but class "
                                                  "indices start at 0. Fix: relabel"):
        _fit(model, opt, state, (x, y - 1), None, 1)
    T.save_state(tmp_path / "s.safetensors", state)
    with pytest.raises(TypeError, match="look-alike of TrainState .* Fix: state = "
                                        r"ff.train.load_state\(path, like="):
        _fit(model, opt, ff.checkpoint.load(tmp_path / "s.safetensors"), (x, y), None, 1)


def test_metrics_of_a_diverged_run_are_strict_json(tmp_path):
    """A NaN or infinite loss is written as null: every line parses as strict JSON."""
    import json

    records = [{"epoch": 1, "train_loss": float("nan"), "test_loss": float("inf"),
                "train_acc": 0.1}, {"epoch": 2, "train_loss": 0.5, "per_class": [0.5, -math.inf]}]
    from fuseflow.train._records import append_metrics, plot_curves, write_metrics

    write_metrics(tmp_path, records[:1])
    append_metrics(tmp_path, records[1])

    def strict(token):
        raise ValueError(f"not strict JSON: {token}")

    lines = (tmp_path / T.METRICS_FILE).read_text().splitlines()
    parsed = [json.loads(line, parse_constant=strict) for line in lines]
    assert parsed == [{"epoch": 1, "train_loss": None, "test_loss": None, "train_acc": 0.1},
                      {"epoch": 2, "train_loss": 0.5, "per_class": [0.5, None]}]
    assert T.read_metrics(tmp_path) == parsed
    plot_curves(parsed, tmp_path / T.CURVES_FILE)  # None points are left out of the plot


def _widening_sum(dtype):
    """A user's transform that keeps a running sum of the gradients, accumulated in
    ``dtype`` (float64 widens a float32 state)."""
    def init(params):
        return {"sum": ff.tree.map(np.zeros_like, params)}

    def update(updates, state, params=None):
        total = ff.tree.map(lambda s, g: (s + g).astype(dtype), state["sum"], updates)
        return ff.tree.map(lambda g: -0.01 * g, updates), {"sum": total}
    return ff.optim.GradientTransformation(init, update)


def test_a_transform_that_widens_its_state_is_named_after_the_first_step(tmp_path):
    """Eager fit checks once that a step keeps the optimizer state's dtypes: a float64
    state would train, but no checkpoint of the run would load with like=init_state."""
    train, test = _data()
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(10))
    state = T.init_state(model, _widening_sum(np.float64), (train[0].shape[1],),
                         ff.random.key(0))
    with pytest.raises(TypeError, match=r"fit: after one step the optimizer state at "
                                        r"'sum/0/b' is float64\[.*not float32.*optimizer's "
                                        r"update changed it.*Fix: keep each leaf's"):
        _fit(model, _widening_sum(np.float64), state, train, test, 1, tmp_path)
    assert not any(tmp_path.iterdir())  # stopped before an epoch was saved
    kept = _fit(model, _widening_sum(np.float32), state, train, test, 1, tmp_path)
    assert ff.tree.leaves(kept.state.opt_state)[0].dtype == np.float32
