"""The training loop: epochs of shuffled mini-batches, an evaluation after each epoch, and,
given an output folder, a checkpoint, a metrics line and a plot per epoch.

``fit`` is a plain loop over the pure pieces (``make_step``, ``evaluate``, ``TrainState``);
everything it knows between epochs is in the TrainState it returns and saves. A run
resumed from a checkpoint therefore continues exactly as the uninterrupted one would have:
same batches, same keys, same optimizer state, same floating-point results.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from fuseflow import random, tree
from fuseflow.checkpoint import metadata_json
from fuseflow._namespace import device_of, is_array, namespace
from fuseflow.backend import all_finite, device_put
from fuseflow.distributed import abort_if_parallel
from fuseflow._compile import compile as compile_step
from fuseflow._dtypes import is_float
from fuseflow.data import batches, num_batches
from fuseflow.data._batches import _check_batch_size
from fuseflow.train._checkpoints import LAST, epoch_checkpoint, save_state
from fuseflow.train._evaluate import EvalResult, evaluate
from fuseflow.train._labels import check_labels, unchecked_cross_entropy
from fuseflow.train._records import (CURVES_FILE, METRICS_FILE, append_metrics, kept_metrics,
                                     plot_curves, write_metrics)
from fuseflow.train._state import TrainState
from fuseflow.train._run_folder import fit_folder, make_writable_folder, names
from fuseflow.train._signals import hold_interrupts, interrupt_between_steps
from fuseflow.train._step import batch_casts, make_step

__all__ = ["fit", "FitResult", "Interrupted", "Diverged"]


class FitResult(NamedTuple):
    state: TrainState
    history: list             # one record (dict, keys FIELDS) per epoch of this out_dir's run
    test: EvalResult | None   # the final evaluation (None without test data)
    checkpoint: Path | None   # the last checkpoint written (None without out_dir)


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C, SIGTERM (``signum`` says which; a KeyboardInterrupt
    from a callback counts as Ctrl-C).

    ``checkpoint`` is the last full checkpoint this call wrote (None if it wrote none) and
    ``epoch`` the number of epochs it holds; nothing newer was written.
    """

    def __init__(self, checkpoint: Path | None, epoch: int, signum: int = signal.SIGINT):
        super().__init__(checkpoint, epoch)
        self.checkpoint, self.epoch, self.signum = checkpoint, epoch, int(signum)


class Diverged(FloatingPointError):
    """``fit`` stopped because an epoch's mean training loss was NaN or infinite and the
    params are no longer all finite: they are not worth saving, so that epoch was neither
    saved nor recorded.
    ``checkpoint`` is the last file this run saved (None if none), ``saved_epoch`` its
    epoch, ``epoch`` the epoch that diverged (1-based) and ``loss`` its mean loss."""

    def __init__(self, epoch: int, loss: float, checkpoint: Path | None, saved_epoch: int):
        self.epoch, self.loss, self.checkpoint, self.saved_epoch = \
            epoch, loss, checkpoint, saved_epoch
        kept = (f"the last checkpoint saved is {checkpoint} (epoch {saved_epoch})"
                if checkpoint is not None else "no checkpoint was saved by this run")
        super().__init__(
            f"fit: epoch {epoch}'s mean training loss is {loss}: training diverged (most often "
            f"a learning rate too high for the model), so the epoch was not saved; {kept}. "
            "Fix: a smaller learning rate (a tenth, say), or check the data and loss for "
            "NaN/inf; fit(..., stop_on_nonfinite=False) trains on regardless.")


class OutDirConflict(FileExistsError):
    """``fit``'s ``out_dir`` holds ``files`` the run would overwrite (see ``fit``)."""

    def __init__(self, message: str, out_dir: Path, files: list):
        super().__init__(message)
        self.out_dir, self.files = out_dir, files


def _placer(params):
    """Moves host arrays to the params' device (the data follows the model)."""
    leaves = tree.leaves(params)
    if leaves and device_of(leaves[0]) == "cuda":
        return lambda t: device_put(t, "cuda")
    return lambda t: t


def fit(model, optimizer, state: TrainState, train, test=None, *, epochs: int,
        batch_size: int, loss_fn=None, out_dir=None, metadata: dict | None = None,
        eval_batch_size: int = 1000, drop_last: bool = True, compute_dtype=None,
        compiled: bool = False, on_step=None, progress: bool = True, log=print,
        log_every: int = 20, comm=None, overwrite: bool = False,
        history: list | None = None, stop_on_nonfinite: bool = True) -> FitResult:
    """Train from ``state`` until ``epochs`` epochs are complete; returns a FitResult.

    ``train``/``test`` are ``(x, y)`` pairs; they are moved to the params' device once.
    ``loss_fn`` defaults to softmax cross-entropy (labels checked once, up front).
    ``drop_last`` keeps every batch the same shape (a different remainder is left out each
    epoch). ``compute_dtype`` is passed to ``make_step`` (mixed precision). ``compiled``
    captures the step in a CUDA graph (``ff.compile``) when the params are on the GPU; a
    model with Dropout (``draws_random``) then gets each step's key as a GPU array. With
    ``out_dir``, each epoch writes ``ckpt-epoch{N}.safetensors``,
    ``last.safetensors`` (``metadata`` plus the epoch's record under "metrics"),
    ``metrics.jsonl`` and ``curves.png``. If ``out_dir`` holds another run's files, or
    epochs after ``state.epoch`` of the run it continues, ``fit`` raises FileExistsError
    before training; with ``overwrite=True`` it replaces them once it has saved an epoch of
    its own (nothing is touched before). ``history``: the records of the epochs before
    ``state.epoch``, put at the top of metrics.jsonl when the run continues in a new
    ``out_dir`` (in its own folder, the records there are kept). A folder is a run's own
    when its checkpoint of ``state``'s epoch, or its last.safetensors, holds exactly
    ``state``: a state saved from ``on_step`` in the middle of an epoch continues in its
    folder if it was saved there as last.safetensors (``save_state(out_dir / LAST,
    state)``, the folder's latest state; the epoch's start stays in its ckpt-epoch file).
    Such a state continues bit for bit, but the resumed epoch's record (train_loss,
    train_acc, samples_per_s) covers only the steps taken after the resume (none, and
    train_loss None, for a state saved after the epoch's last step): the state carries no
    running sums.
    ``on_step(state, metrics)`` runs after every step. ``log`` prints one summary line per
    epoch (None: silent); ``progress`` shows a per-epoch tqdm bar on terminals. Ctrl-C or
    SIGTERM stops after the step in progress (with ``comm``: after the epoch in progress,
    on every rank) and raises ``Interrupted`` (a KeyboardInterrupt); a second one stops at
    once (with ``comm``, that rank alone: it ends the whole job, MPI_Abort).
    ``comm`` (``ff.distributed.init()``) trains data-parallel: every rank runs ``fit`` on the
    same data; each global batch is split over the ranks, gradients are averaged, and the
    whole state (params, optimizer state, epoch, step and keys) starts from rank 0's. Give
    ``out_dir``/``log``/``progress`` on rank 0 only. An epoch whose mean training loss is
    NaN or infinite, with params no longer all finite, raises ``Diverged`` before anything
    of it is saved, unless ``stop_on_nonfinite=False`` (every rank stops together: the
    loss is their mean and the params are the same on every rank).
    """
    if not isinstance(state, TrainState):
        if type(state).__name__ == "TrainState":  # a look-alike: checkpoint.load without like
            raise TypeError("fit: state is a look-alike of TrainState (ff.checkpoint.load "
                            "without like= rebuilds the classes it saved). Fix: state = "
                            "ff.train.load_state(path, like=ff.train.init_state(model, "
                            "optimizer, in_shape, key)).")
        raise TypeError(f"fit: state must be a TrainState, got {type(state).__name__}. "
                        "Fix: state = ff.train.init_state(model, optimizer, in_shape, key).")
    train = _pair("train", train)
    if test is not None:
        test = _pair("test", test)
        if not len(test[0]):
            raise ValueError("fit: the test set is empty (0 examples). Fix: test=None to "
                             "train without evaluating, or pass the test examples.")
        eval_batch_size = _check_batch_size(eval_batch_size, "fit", "eval_batch_size")
    if not len(train[0]):
        raise ValueError("fit: the training set is empty (0 examples). Fix: pass the "
                         "training examples, train=(x, y).")
    batch_size = _check_batch_size(batch_size, "fit")
    log_every = _check_batch_size(log_every, "fit", "log_every")  # steps between bar updates
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)):
        raise TypeError(f"fit: epochs must be an int (the number of epochs complete when fit "
                        f"returns), got {epochs!r} ({type(epochs).__name__}). Fix: "
                        f"epochs={_as_int_hint(epochs)}.")
    epochs = int(epochs)
    if epochs < state.epoch:
        raise ValueError(f"fit: epochs={epochs!r} but the state has already completed "
                         f"{state.epoch} epochs. Fix: epochs >= {state.epoch}.")
    if metadata is not None:  # checked now, not when the first epoch's checkpoint is saved
        try:
            metadata_json(metadata)
        except TypeError as e:
            raise TypeError(f"fit: {e}") from None
    if comm is not None and comm.size > 1:  # every rank raises together, or none does
        comm.check_same("output folder", "given on rank 0 only" if comm.is_main or
                        out_dir is None else f"out_dir={str(out_dir)!r} on rank {comm.rank}",
                        "give out_dir on rank 0 only (out_dir=... if comm.is_main else "
                        "None): every rank writing the same files would repeat the records.")
        comm.check_data("training set", *train)
        if test is not None:
            comm.check_data("test set", *test)
    stale, history = [], list(history or [])
    if out_dir is not None:
        out_dir = Path(out_dir)
        stale, history = _claim_out_dir(out_dir, state, overwrite, history)
    put = _placer(state.params)
    x, y = put(train)
    _check_finite("train", x)
    if test is not None:
        test = put(test)
        _check_finite("test", test[0])
    if loss_fn is None:
        check_labels(model, state.params, x, y, "fit: train")
        if test is not None:
            check_labels(model, state.params, *test, "fit: test")
        loss_fn = unchecked_cross_entropy
    steps_per_epoch = num_batches(len(x), batch_size, drop_last)
    if steps_per_epoch == 0:
        raise ValueError(f"fit: {len(x)} training examples make no batch of {batch_size}. "
                         f"Fix: batch_size <= {len(x)}, or drop_last=False.")
    if not 0 <= state.batch_in_epoch <= steps_per_epoch:
        raise ValueError(f"fit: the state is at batch {state.batch_in_epoch} of epoch "
                         f"{state.epoch + 1}, but {len(x)} training examples make "
                         f"{steps_per_epoch} batches of {batch_size} an epoch. A state saved "
                         "in the middle of an epoch continues with the training set, "
                         "batch_size and drop_last it was saved with. Fix: pass those, or "
                         "resume from the epoch's start (its ckpt-epoch checkpoint).")

    if comm is not None and comm.size > 1:
        if batch_size % comm.size:
            raise ValueError(f"fit: batch_size {batch_size} cannot be split over {comm.size} "
                             f"ranks. Fix: a batch size divisible by {comm.size}.")
        last = len(x) % batch_size
        if not drop_last and last % comm.size:  # found now, not after an epoch of steps
            raise ValueError(f"fit: the last batch of each epoch ({len(x)} examples % "
                             f"batch_size {batch_size} = {last}) cannot be split over "
                             f"{comm.size} ranks. Fix: drop_last=True, or a training set whose "
                             f"size leaves a multiple of {comm.size}.")
        comm.check_model(state.params)
        # the whole state: the ranks must agree on the epoch, the step, the data order and
        # the layers' key too, or their shares are not one global batch (or one rank waits)
        state = comm.broadcast(state)
    else:
        comm = None
    step_fn = _summing(make_step(model, loss_fn, optimizer, compute_dtype=compute_dtype,
                                 comm=comm))
    if compiled:  # ff.compile checks the state's types itself
        casts = batch_casts(compute_dtype, x, 3)  # (params, opt_state, sums, x, y)
        step_fn = _keyed(step_fn, put, casts) if draws_random(model) else \
            _keyless(compile_step(step_fn, donate_argnums=(0, 1, 2), cast_args=casts))
    else:
        step_fn = _first_checked(step_fn)
        step_fn.takes_key = draws_random(model)  # else no key is derived per step
    saved, saved_epoch, final = None, state.epoch, None
    try:
        with interrupt_between_steps() as stop:
            for epoch in range(state.epoch, epochs):
                # handed over in a list the epoch empties: the epoch's first state is not
                # kept alive beside its later ones (for Adam, three copies of the params)
                held, state = [state], None
                state, record = _train_epoch(step_fn, held, x, y, epoch, epochs, batch_size,
                                             steps_per_epoch, drop_last, on_step, progress,
                                             log_every, comm, None if comm else stop)
                if stop_on_nonfinite and _diverged(record, state.params):
                    raise Diverged(record["epoch"], record["train_loss"], saved, saved_epoch)
                final = _evaluate(model, state.params, test, eval_batch_size, loss_fn)
                if final is not None:
                    record.update(test_loss=final.loss, test_acc=final.accuracy)
                history.append(record)
                if out_dir is not None:
                    with hold_interrupts(stop):  # the epoch's files and metrics, or none
                        _save_epoch(out_dir, state, record, metadata, stale,
                                    rewrite=history if saved is None else None)
                        saved, saved_epoch, stale = out_dir / LAST, state.epoch, []
                    _plot(history, out_dir / CURVES_FILE)
                if log is not None:
                    log(_summary(record, epochs))
                if comm is None:
                    stop.check()
                elif agreed := _agree_on_stop(stop, comm):
                    raise Interrupted(saved, saved_epoch, agreed)  # every rank, together
    except Interrupted:
        raise
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        if comm is not None:  # this rank alone (a second signal): the others would wait
            abort_if_parallel(128 + signum, f"was stopped alone by "
                                            f"{signal.Signals(signum).name}")
        raise Interrupted(saved, saved_epoch, signum) from None
    if final is None:  # no epoch ran here (a finished run resumed), or no test data
        final = _evaluate(model, state.params, test, eval_batch_size, loss_fn)
    return FitResult(state=state, history=history, test=final, checkpoint=saved)


def _pair(name, data):
    """``data`` as an ``(x, y)`` tuple of arrays, or a TypeError that says so."""
    pair = isinstance(data, (tuple, list)) and len(data) == 2
    if pair and all(is_array(a) for a in data):
        return tuple(data)
    if pair:
        k = next(i for i, a in enumerate(data) if not is_array(a))
        got = f"a pair whose {('x', 'y')[k]} is a {type(data[k]).__name__}, not an array"
    elif isinstance(data, (tuple, list)):
        got = f"a {type(data).__name__} of {len(data)}"
    else:
        got = f"a {type(data).__name__}"
    raise TypeError(f"fit: {name} must be an (x, y) pair of arrays (inputs, labels), got "
                    f"{got}. Fix: fit(..., {name}=(x_{name}, y_{name}), ...).")


def _check_finite(name, x):
    """NaN or inf in the inputs would train (and checkpoint) NaN params without a word:
    one pass over float data, once per fit (one launch and one read-back on a GPU; the
    per-example mask only when something is not finite)."""
    if not (is_float(x.dtype) or x.dtype.kind == "c") or bool(all_finite([x])):
        return
    xp = namespace(x)
    row = int(xp.argmin(xp.isfinite(x).reshape(len(x), -1).all(axis=1)))
    raise ValueError(f"fit: the {name} inputs hold NaN or inf (first in example {row}). Fix: "
                     "clean or drop those examples, e.g. keep = np.isfinite(x).reshape("
                     "len(x), -1).all(axis=1); x, y = x[keep], y[keep].")


def _as_int_hint(value) -> str:
    """A whole-number suggestion for a non-int ``epochs`` (``5`` for 5.0), else ``5``."""
    try:
        if float(value) == int(value) and int(value) >= 0:
            return str(int(value))
    except (TypeError, ValueError, OverflowError):
        pass
    return "5"


def _summing(step_fn):
    """``step(params, opt_state, sums, x, y, key=None) -> (params, opt_state, sums,
    metrics)``: the step, then the epoch's running float64 sums of loss and accuracy times
    the batch size, returned like the params. Compiled, they are added inside the graph: the
    loop then runs no array operation of its own per step (on a GPU each would cost more
    host time than a short step's whole GPU time)."""
    def step(params, opt_state, sums, x, y, key=None):
        params, opt_state, metrics = step_fn(params, opt_state, x, y, key=key)
        loss = metrics["loss"]
        xp = namespace(loss)
        acc = metrics["accuracy"] if "accuracy" in metrics else xp.zeros((), loss.dtype)
        return params, opt_state, sums + xp.stack([loss, acc]).astype(sums.dtype) * len(x), \
            metrics
    return step


def _first_checked(step_fn):
    """The step, its first call checked to return params and optimizer state of the
    structure, shapes and dtypes it was given: a transform of the user's own that widened
    its state to float64 would train on, but its checkpoints would not load with
    ``like=init_state(...)`` (the compiled step checks this itself)."""
    def step(params, opt_state, sums, x, y, key=None):
        out = step_fn(params, opt_state, sums, x, y, key=key)
        if step.unchecked:
            _check_kept("the params", params, out[0], "the model's layers")
            _check_kept("the optimizer state", opt_state, out[1], "the optimizer's update")
            step.unchecked = False
        return out
    step.unchecked = True
    return step


def _check_kept(what, old, new, who):
    """``new`` has ``old``'s structure and, leaf by leaf, its shape and dtype."""
    if tree.structure(new) != tree.structure(old):
        raise TypeError(f"fit: after one step {what} have the structure {tree.structure(new)}, "
                        f"not {tree.structure(old)}: {who} changed it, and the run's "
                        "checkpoints would not load with like=. Fix: return the state in the "
                        "structure init() made.")
    changed = tree.first_changed_leaf(old, new)
    if changed is not None:
        path, o, n = changed
        got = f"{n.dtype}{list(n.shape)}" if is_array(n) else type(n).__name__
        raise TypeError(
            f"fit: after one step {what} at {path!r} is {got}, not "
            f"{o.dtype}{list(o.shape)}: {who} changed it, so the run's checkpoints would "
            "not load with like=init_state(...). Fix: keep each leaf's shape and dtype "
            "in the update (e.g. new.astype(old.dtype)).")


def draws_random(model) -> bool:
    """Whether the model's training forward draws random numbers (``Layer.draws_random``)."""
    return bool(getattr(model, "draws_random", False))


def _keyed(step_fn, put, casts=None):
    """The step compiled with the layers' key as a sixth positional array, moved to the
    params' device each step (on the GPU the graph then copies it in, like the batch)."""
    compiled = compile_step(lambda p, s, sums, x, y, k: step_fn(p, s, sums, x, y, key=k),
                            donate_argnums=(0, 1, 2), cast_args=casts)

    def step(params, opt_state, sums, x, y, key=None):
        return compiled(params, opt_state, sums, x, y, put(key))
    return step


def _keyless(compiled_step):
    """A compiled step takes positional arrays only; its model draws no random numbers."""
    def step(params, opt_state, sums, x, y, key=None):
        return compiled_step(params, opt_state, sums, x, y)
    step.takes_key = False  # the loop skips deriving a key per step (host time)
    return step


def _train_epoch(step_fn, held, x, y, epoch, epochs, batch_size, steps_per_epoch,
                 drop_last, on_step, progress, log_every, comm=None, stop=None):
    """One epoch from the state in the one-element list ``held`` (taken out of it)."""
    state = held.pop()
    start = state.batch_in_epoch
    todo = min(len(x), steps_per_epoch * batch_size) - start * batch_size
    order_key = random.fold_in(state.data_key, epoch)
    takes_key = getattr(step_fn, "takes_key", True)
    sums = namespace(tree.leaves(state.params)[0]).zeros(2, dtype=np.float64)  # loss, acc
    seen = 0
    has_acc = False
    bar = tqdm(total=todo, desc=f"epoch {epoch + 1}/{epochs}", unit="sample", unit_scale=True,
               leave=False, disable=None if progress else True, dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        for xb, yb in batches(x, y, batch_size, key=order_key, drop_last=drop_last,
                              start_batch=start):
            if comm is not None:  # every rank sees the global batch and takes its share
                xb, yb = comm.shard(xb, yb)
            key = random.fold_in(state.key, state.step) if takes_key else None
            if key is not None and comm is not None:  # each rank's shard its own draws
                key = random.fold_in(key, comm.rank)
            params, opt_state, sums, metrics = step_fn(state.params, state.opt_state, sums,
                                                       xb, yb, key=key)
            state = state._replace(params=params, opt_state=opt_state, step=state.step + 1,
                                   batch_in_epoch=state.batch_in_epoch + 1)
            n = len(xb)
            has_acc = has_acc or "accuracy" in metrics
            seen += n
            if on_step is not None:
                on_step(state, metrics)
            if stop is not None:
                stop.check()  # Ctrl-C takes effect here, between two steps
            bar.update(n * (comm.size if comm is not None else 1))  # the global batch
            if not bar.disable and state.batch_in_epoch % log_every == 0:
                bar.set_postfix({k: f"{float(v):.4f}" for k, v in metrics.items()},
                                refresh=False)
        # reading the sums waits for the device: the epoch's timing is honest
        loss_sum, acc_sum = (float(v) for v in sums.tolist())
        if comm is not None:  # the epoch's means over every rank's shard
            loss_sum, acc_sum = (comm.allreduce_mean(np.array([loss_sum, acc_sum]))
                                 * comm.size)
            seen *= comm.size
        # None where a state saved after the epoch's last step took no step here
        train_loss = loss_sum / seen if seen else None
        seconds = time.perf_counter() - t0
    finally:
        bar.close()
    record = {"epoch": epoch + 1, "step": state.step, "train_loss": train_loss,
              "train_acc": acc_sum / seen if has_acc and seen else None,
              "test_loss": None, "test_acc": None, "seconds": seconds,
              "samples_per_s": seen / seconds if seconds > 0 else None}
    return state._replace(epoch=epoch + 1, batch_in_epoch=0), record


def _diverged(record, params) -> bool:
    """The epoch's mean loss is NaN or inf and so are some params. A non-finite loss alone
    is no divergence under dynamic loss scaling: a float16 forward that overflowed on one
    batch gives that step a NaN loss, and the step is skipped with the params unchanged."""
    return record["train_loss"] is not None and not math.isfinite(record["train_loss"]) and \
        not bool(all_finite(tree.leaves(params)))


def _evaluate(model, params, test, batch_size, loss_fn):
    if test is None:
        return None
    return evaluate(model, params, *test, batch_size, loss_fn=loss_fn)


def _claim_out_dir(out_dir: Path, state: TrainState, overwrite: bool, history: list):
    """Refuse to replace another run's files, or later epochs of this one, unless
    ``overwrite`` (nothing a user saved is lost by accident). Returns the checkpoints to
    delete once this run has saved an epoch (with ``overwrite``: the old ones it replaces),
    and the records its metrics.jsonl starts from."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"fit: out_dir {out_dir} is a file, but a folder is expected "
                                 "(for the checkpoints and metrics.jsonl). Fix: out_dir=a "
                                 "folder path; it is created if missing.")
    make_writable_folder(out_dir, "fit: out_dir", fix="out_dir=")
    epoch = state.epoch
    own, replaced = fit_folder(out_dir, state)
    if replaced and not overwrite:
        raise OutDirConflict(_conflict(out_dir, state, own, replaced), out_dir, replaced)
    stale = [p for p in replaced if p.name not in (METRICS_FILE, CURVES_FILE)]  # checkpoints
    kept = kept_metrics(out_dir, epoch) if own else [r for r in history
                                                      if r.get("epoch", 0) <= epoch]
    return stale, kept


def _conflict(out_dir: Path, state: TrainState, own: bool, replaced: list) -> str:
    """Why ``fit`` will not write into ``out_dir``, and the ways on."""
    epoch = state.epoch
    if state.batch_in_epoch:
        start = f"a run continuing in the middle of epoch {epoch + 1}"
    else:
        start = "a run from epoch 0" if epoch == 0 else f"a run continuing after epoch {epoch}"
    last = out_dir / LAST
    resume = (f"resume from the folder's latest checkpoint (state = "
              f"ff.train.load_state({str(last)!r}, like=state)), or " if last.is_file() else "")
    message = (f"fit: out_dir {out_dir} already holds {names(replaced)}, which {start} would "
               f"overwrite. Fix: out_dir=NEW_DIR, or {resume}overwrite=True to replace them.")
    if own or not state.batch_in_epoch:
        return message
    return (f"{message} If this state continues the folder's run (saved from on_step), "
            f"neither {LAST} nor a ckpt-epoch file there holds it: save it as the folder's "
            f"latest state (ff.train.save_state({str(out_dir / LAST)!r}, state)) to continue "
            "there, or continue in a new out_dir with history=ff.train.read_metrics("
            f"{str(out_dir / METRICS_FILE)!r}).")


def _plot(history, path):
    """curves.png, a picture of metrics.jsonl: a failure to write it (a full disk, a folder
    in its place) is a warning, not the end of a run whose checkpoint is already saved."""
    try:
        plot_curves(history, path)
    except OSError as e:
        warnings.warn(f"fit: could not write {path} ({e}); training goes on, and "
                      "metrics.jsonl has the same records. Fix: free the path (or the disk) "
                      "for the next epoch's plot.", RuntimeWarning, stacklevel=3)


def _save_epoch(out_dir, state, record, metadata, stale, rewrite=None):
    """The epoch's metrics line (``rewrite``, at the first epoch a call saves: every record,
    in place of metrics.jsonl), its checkpoint and last.safetensors, in an order that
    leaves records and checkpoints agreeing if a write fails half-way: the record first,
    cut off again if the checkpoint then cannot be written (a full disk), so that a resume
    from the epoch before continues in place; last.safetensors last. Replacing an old run
    (``stale``: its checkpoints), the new checkpoint comes first and the old ones go at
    once, so a failure before leaves the old run whole."""
    meta = dict(metadata or {}, metrics=record)
    written = epoch_checkpoint(out_dir, state.epoch)
    if stale:
        save_state(written, state, meta)
        for path in stale:
            if path != written:
                path.unlink(missing_ok=True)
    metrics = Path(out_dir) / METRICS_FILE
    before = metrics.stat().st_size if rewrite is None and metrics.exists() else 0
    if rewrite is None:
        append_metrics(out_dir, record)
    else:
        write_metrics(out_dir, rewrite)
    if not stale:
        try:
            save_state(written, state, meta)
        except OSError:
            if rewrite is None:  # the record without its checkpoint goes again
                with contextlib.suppress(OSError):
                    os.truncate(metrics, before)
            raise
    save_state(out_dir / LAST, state, meta)


def _agree_on_stop(stop, comm):
    """With several ranks, the signal every rank stops with at this epoch end, or None: a
    stop request takes effect on all ranks together (a rank that stopped alone would leave
    the others waiting in the next allreduce). Each rank votes with the request it had when
    it got here; one that comes during the vote waits for the next epoch's."""
    mine = stop.signum
    asked = comm.allreduce_mean(np.array([mine == signal.SIGINT, mine == signal.SIGTERM],
                                         np.float64))
    if asked[1] > 0:
        return signal.SIGTERM
    return signal.SIGINT if asked[0] > 0 else None


def _summary(r, epochs):
    parts = [f"epoch {r['epoch']}/{epochs}"]
    for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
        if r[key] is not None:
            parts.append(f"{key}={r[key]:.4f}")
    seconds = r["seconds"]  # a compiled GPU epoch takes tens of ms: those show as 0.042s
    parts.append(f"{seconds:.3f}s" if seconds < 1 else f"{seconds:.1f}s")
    if r["samples_per_s"]:
        parts.append(f"{r['samples_per_s']:,.0f} samples/s")
    return "  ".join(parts)
