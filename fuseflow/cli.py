"""The ``fuseflow`` command: ``train``, ``eval`` and ``bench``.

    fuseflow train --data-dir ../shared/data/mnist --out runs/mnist
    fuseflow eval runs/mnist/last.safetensors
    fuseflow bench --hidden 1024,1024 --steps 50

The last line ``train`` and ``eval`` print is ``test_accuracy=0.XXXX`` (scripts can take
it with ``tail -n 1``). Exit codes: 0 done, 1 an error with a message that names the fix
(data, checkpoint, backend, options that contradict a checkpoint), 2 a malformed command
line, 130 stopped by Ctrl-C, 143 by SIGTERM. The training recipe is saved in every
checkpoint, so ``eval`` and ``train --resume`` need nothing but the file. Full reference:
docs/cli.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from fuseflow import __version__, backend, checkpoint, data, distributed, random
from fuseflow._compile import compile as compile_step
from fuseflow.data import num_batches
from fuseflow.train import (METRICS_FILE, Interrupted, Recipe, RecipeError, batch_casts,
                            evaluate, fit, init_state, load_dataset, load_state,
                            make_step, read_metrics)
from fuseflow.train._fit import Diverged, OutDirConflict
from fuseflow.train._run_folder import (RunFolder, RunFolderError, latest_checkpoint, names,
                                        needs_overwrite)
from fuseflow.train._signals import StopRequest, hold_interrupts, sigterm_as_interrupt
from fuseflow.train._datasets import _load_split
from fuseflow.train._labels import unchecked_cross_entropy
from fuseflow.train._recipe import (ACTIVATIONS, DEFAULT_LR, LOSS_SCALINGS, OPTIMIZERS,
                                    PRECISIONS, SCHEDULES)

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143

#: defaults of ``fuseflow train`` (options left out on the command line; on --resume the
#: checkpoint's recipe takes their place)
DEFAULTS = dict(dataset="mnist", hidden=(512, 512), activation="relu", epochs=5,
                batch_size=128, optimizer="adam", weight_decay=0.0, schedule="cosine",
                seed=0, precision="float32", backend="auto")
#: recipe fields an explicit option may not change on --resume (they define the run)
_FIXED_ON_RESUME = ("hidden", "activation", "optimizer", "lr", "weight_decay", "schedule",
                    "batch_size", "seed", "precision", "loss_scaling")


class CLIError(Exception):
    """An error to report as one message and exit code 1 (no traceback)."""


# ------------------------------------------------------------------------------- parsing

def _hidden(text: str) -> tuple:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive layer widths such as 1024,1024; got {text!r}")
    return sizes


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or not math.isfinite(value):
            finite = " finite" if kind is float else ""
            raise argparse.ArgumentTypeError(
                f"expected a positive{finite} {kind.__name__}, got {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2 ** 64:
        raise argparse.ArgumentTypeError(f"expected an int in [0, 2**64), got {text!r}")
    return value


def _path(text: str) -> str:
    """A path option: an empty one (an unset shell variable, ``--resume "$CKPT"``) would
    otherwise read as not given and start a fresh run, or write to the default folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r} (an empty shell "
                                         "variable?)")
    return text


def _backend_option(p):
    p.add_argument("--backend", choices=("auto", "numpy", "cuda"), default="auto",
                   help="where arrays live: numpy (any CPU), cuda (CuPy + nvmath on an NVIDIA "
                        "GPU), auto (cuda when usable, else numpy). Default: auto")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fuseflow", description="Train and evaluate MLPs on MNIST-style data.",
        epilog="Exit codes: 0 ok, 1 error, 2 bad command line, 130 interrupted (Ctrl-C), "
               "143 terminated (SIGTERM).")
    parser.add_argument("--version", action="version", version=f"fuseflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,eval,bench}")
    d = DEFAULTS

    t = sub.add_parser("train", help="train an MLP; last line: test_accuracy=0.XXXX",
                       description="Train an MLP; write metrics.jsonl, curves.png and a "
                                   "checkpoint per epoch to --out. Options left out take "
                                   "their defaults, or the checkpoint's values with --resume.")
    t.add_argument("--dataset", choices=("mnist", "digits"), default=None,
                   help=f"mnist, or scikit-learn's 8x8 digits (offline). Default: "
                        f"{d['dataset']}, falling back to digits when MNIST is nowhere")
    t.add_argument("--data-dir", type=_path, metavar="DIR", default=None,
                   help="a folder with the four IDX files (MNIST, Fashion-MNIST, ...), or one "
                        "holding mnist/; input width and classes come from the data")
    t.add_argument("--hidden", type=_hidden, default=None, metavar="W1,W2,...",
                   help=f"hidden layer widths. Default: {','.join(map(str, d['hidden']))}")
    t.add_argument("--activation", choices=ACTIVATIONS, default=None,
                   help=f"hidden activation (fused in the matmul). Default: {d['activation']}")
    t.add_argument("--epochs", type=_positive(int), default=None,
                   help=f"epochs in all (a resumed run continues to this). Default: {d['epochs']}")
    t.add_argument("--batch-size", type=_positive(int), default=None,
                   help=f"examples per step. Default: {d['batch_size']}")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help=f"momentum is sgd with momentum 0.9. Default: {d['optimizer']}")
    t.add_argument("--lr", type=_positive(float), default=None,
                   help="peak learning rate. Default: " + ", ".join(
                       f"{k} {v:g}" for k, v in DEFAULT_LR.items()))
    t.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help=f"cosine: lr decays to 0 over all epochs. Default: {d['schedule']}")
    t.add_argument("--weight-decay", type=_non_negative_float, default=None, metavar="WD",
                   help="decoupled weight decay of the weights (not biases); adamw only. "
                        "Default: 0 (1e-4 with adamw)")
    t.add_argument("--seed", type=_seed, default=None,
                   help=f"fixes initialisation and data order. Default: {d['seed']}")
    t.add_argument("--precision", "--dtype", choices=PRECISIONS, default=None,
                   help="float16, bfloat16: mixed precision (16-bit compute, float32 master "
                        "weights; see --loss-scaling); meant for GPUs. "
                        f"Default: {d['precision']}")
    _loss_scaling_option(t)
    _backend_option(t)
    t.add_argument("--out", type=_path, metavar="DIR", default=None,
                   help="output folder. Default: runs/<dataset> (with --data-dir: "
                        "runs/<that folder's name>), or the checkpoint's folder with --resume")
    t.add_argument("--resume", type=_path, metavar="CKPT", default=None,
                   help="continue the run saved in CKPT (e.g. runs/mnist/last.safetensors); "
                        "the result is bit for bit that of an uninterrupted run")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run files already in --out (another run's, or later "
                        "epochs of the resumed one) instead of refusing; they are kept aside "
                        "until the new run has saved an epoch, and put back if it stops before")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    e = sub.add_parser("eval", help="test accuracy of a checkpoint; prints test_accuracy=0.XXXX",
                       description="Rebuild the model from a `fuseflow train` checkpoint and "
                                   "evaluate it on its data set's test split.")
    e.add_argument("checkpoint", type=_path, metavar="CKPT")
    e.add_argument("--data-dir", type=_path, metavar="DIR", default=None,
                   help="where the test IDX files are now (default: where training found them)")
    e.add_argument("--batch-size", type=_positive(int), default=None,
                   help="evaluation batch size. Default: the one training used (1000)")
    _backend_option(e)

    b = sub.add_parser("bench", help="time training steps on random data; prints steps/s",
                       description="Time N training steps of an MLP on random data "
                                   "(no data set needed).")
    b.add_argument("--hidden", type=_hidden, default=d["hidden"], metavar="W1,W2,...",
                   help=f"Default: {','.join(map(str, d['hidden']))}")
    b.add_argument("--activation", choices=ACTIVATIONS, default="relu")
    b.add_argument("--batch-size", type=_positive(int), default=d["batch_size"])
    b.add_argument("--input-width", type=_positive(int), default=784)
    b.add_argument("--classes", type=_positive(int), default=10)
    b.add_argument("--optimizer", choices=OPTIMIZERS, default=d["optimizer"])
    b.add_argument("--steps", type=_positive(int), default=100, help="timed steps (100)")
    b.add_argument("--warmup", type=_non_negative_int, default=5,
                   help="untimed steps first (5)")
    b.add_argument("--precision", "--dtype", choices=PRECISIONS, default="float32")
    _loss_scaling_option(b)
    _backend_option(b)
    return parser


def _loss_scaling_option(parser):
    parser.add_argument("--loss-scaling", choices=LOSS_SCALINGS, default=None,
                        help="16-bit runs: dynamic (skips steps whose gradients overflow and "
                             "adapts the scale), or none (bfloat16 only: every step applied, "
                             "as PyTorch and JAX train bfloat16; faster). Default: none in "
                             "bfloat16, dynamic in float16")


def _loss_scaling(given: str | None, precision: str) -> str:
    """``--loss-scaling`` as given, or left out: none in bfloat16 (float32's range; PyTorch's
    autocast and JAX train it unscaled, and on the GPU the step is faster: calls 153-154),
    dynamic in float16 (its small gradients need the scale) and, recorded but unused, in
    float32."""
    if given:
        return given
    return "none" if precision == "bfloat16" else "dynamic"


# ------------------------------------------------------------------------------- helpers

def _select_backend(name: str) -> str:
    """Resolve and check the backend; print the one line that says which one runs."""
    resolved = backend.resolve(name)
    try:
        backend.get(resolved)
    except RuntimeError as e:
        message = str(e).replace("use backend='numpy'", "--backend numpy (or auto)")
        raise CLIError(f"--backend {name}: {message}") from None
    why = " (auto: no usable CUDA GPU)" if name == "auto" and resolved == "numpy" else ""
    print(f"backend: {resolved}{why}", flush=True)
    return resolved


def _to_device(state, device: str):
    if device != "cuda":
        return state
    return state._replace(params=backend.device_put(state.params, "cuda"),
                          opt_state=backend.device_put(state.opt_state, "cuda"))


def _read_recipe(path: Path, option: str) -> Recipe:
    """The recipe in the checkpoint ``path`` given as ``option`` (for the messages)."""
    if path.is_dir():
        latest = latest_checkpoint(path)
        fix = (f"Fix: {option} {latest}" if latest else
               "It holds no checkpoint (last.safetensors or ckpt-epoch{N}.safetensors). Fix: "
               "pass a checkpoint file such as runs/mnist/last.safetensors")
        raise CLIError(f"{option} {path} is a folder, but a checkpoint file is expected. "
                       f"{fix}.")
    if not path.is_file():
        raise CLIError(f"checkpoint {path} does not exist. Fix: pass a file such as "
                       "runs/mnist/last.safetensors.")
    meta = checkpoint.read_metadata(path)
    return Recipe.from_metadata(meta.get("recipe"), str(path))


def _check_data_fits(recipe: Recipe, width: int, classes: int, where: str):
    if width != recipe.input_width or classes > recipe.classes:
        raise CLIError(f"{where}: the data has {width} inputs and {classes} classes, but the "
                       f"checkpoint's model takes {recipe.input_width} inputs and "
                       f"{recipe.classes} classes. Fix: --data-dir with the data it was "
                       "trained on.")


def _no_data_dir_for_digits(data_dir, who: str):
    if data_dir is not None:
        fix = (", or drop --dataset digits to train on the IDX files in that folder"
               if who.startswith("--dataset") else "")
        raise CLIError(f"--data-dir {data_dir}: {who} scikit-learn's built-in digits, which "
                       f"read no folder, so --data-dir would be ignored. Fix: drop "
                       f"--data-dir{fix}.")


def _check_metrics(path: Path):
    """A damaged ``metrics.jsonl`` that a resumed run would read, reported before any work.
    (A last line cut short by a crash is no error: the run drops it, with a warning.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            read_metrics(path)
    except (ValueError, OSError) as e:
        raise CLIError(str(e)) from None


#: Peak memory of a CPU training run, in float32 copies of the params, by --precision and
#: optimizer, with at least one copy to spare: ``benchmarks/cpu_memory.py`` measured the
#: peak resident memory of ``fuseflow train --dataset digits`` at --hidden 6000,6000 and
#: 9000,9000 (the slope between the two): float32 2.99, 4.02, 6.02 and 6.02; float16
#: 3.03, 4.52, 6.53 and 6.52. In float32 a step holds at its peak the old params and
#: slots, the gradients (which become the new params) and the new slots; float16 adds the
#: 16-bit copies of the params and gradients.
_COPIES = {"float32": {"sgd": 4, "momentum": 5, "adam": 7, "adamw": 7},
           "float16": {"sgd": 5, "momentum": 6, "adam": 8, "adamw": 8}}
# the same path in another 16-bit dtype: measured 3.03, 4.53, 6.53 and 6.53
_COPIES["bfloat16"] = _COPIES["float16"]
#: bfloat16 with --loss-scaling none: the optimizer state keeps the params' bfloat16 copy
#: and a step makes the next one beside it; measured 3.53, 5.53, 7.51 and 7.52
#: (``benchmarks/results/cpu_memory_bfloat16_unscaled.json``)
_COPIES_UNSCALED = {"sgd": 5, "momentum": 7, "adam": 9, "adamw": 9}
#: Before Python 3.11 a caller holds the arguments of a call until it returns, so the
#: initial state (the params and the optimizer's slots) stays alive through ``fit``.
_HELD_BY_CALLER = {"sgd": 1, "momentum": 2, "adam": 3, "adamw": 3} \
    if sys.version_info < (3, 11) else {}


def peak_copies(precision: str, optimizer: str, loss_scaling: str = "dynamic") -> int:
    """Float32 copies of the params a CPU training run holds at its peak (with a spare)."""
    table = _COPIES_UNSCALED if precision == "bfloat16" and loss_scaling == "none" \
        else _COPIES[precision]
    return table[optimizer] + _HELD_BY_CALLER.get(optimizer, 0)


def _check_model_fits(recipe: Recipe, bench: bool = False) -> int:
    """The model's parameter count; a --hidden too large for this machine's memory is
    refused before an allocation fails with a traceback, or the kernel kills the process.
    ``bench``: --input-width and --classes are options too, named where one is the widest."""
    widths = (recipe.input_width, *recipe.hidden, recipe.classes)
    params = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    copies = peak_copies(recipe.precision, recipe.optimizer, recipe.loss_scaling)
    need = params * 4 * copies
    memory = _physical_memory()
    if memory and need > memory:
        option, fix = f"--hidden {_show(recipe.hidden)}", \
            "smaller --hidden widths, e.g. --hidden 512,512"
        if bench and recipe.input_width > max(*recipe.hidden, recipe.classes):
            option, fix = f"--input-width {recipe.input_width}", "a smaller --input-width"
        elif bench and recipe.classes > max(*recipe.hidden, recipe.input_width):
            option, fix = f"--classes {recipe.classes}", "fewer --classes"
        raise CLIError(f"{option}: the model would have {params:,} "
                       f"parameters, and training it with {recipe.optimizer} takes about "
                       f"{_bytes(need)} (measured: {copies} float32 copies "
                       f"of the params at its peak), more than this machine's "
                       f"{_bytes(memory)} of memory. Fix: {fix}.")
    return params


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return None


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


# ------------------------------------------------------------------------------- commands

def _run_name(ds) -> str:
    """The default output folder's name: the data set's ("mnist", "digits"), or for IDX
    files that of their folder (``--data-dir ../data/mnist`` or ``../data``: "mnist")."""
    if ds.name != "idx":
        return ds.name
    folder = Path(ds.data_dir)
    return "mnist" if (folder / "mnist").is_dir() else folder.name


def _fresh_recipe(args, ds) -> Recipe:
    d = DEFAULTS
    optimizer = args.optimizer or d["optimizer"]
    weight_decay = args.weight_decay
    if weight_decay is None:
        weight_decay = 1e-4 if optimizer == "adamw" else d["weight_decay"]
    precision = args.precision or d["precision"]
    return Recipe(dataset=ds.name, data_dir=ds.data_dir, input_width=ds.input_width,
                  classes=ds.classes, hidden=tuple(args.hidden or d["hidden"]),
                  activation=args.activation or d["activation"], optimizer=optimizer,
                  lr=args.lr or DEFAULT_LR[optimizer], weight_decay=weight_decay,
                  schedule=args.schedule or d["schedule"], epochs=args.epochs or d["epochs"],
                  batch_size=args.batch_size or d["batch_size"],
                  seed=d["seed"] if args.seed is None else args.seed,
                  precision=precision,
                  loss_scaling=_loss_scaling(args.loss_scaling, precision),
                  train_examples=len(ds.train[0]))


def _precision_shown(recipe: Recipe) -> str:
    """The precision as the run line shows it: a 16-bit run says how it scales its loss."""
    if recipe.precision == "float32":
        return "float32"
    scaling = "dynamic loss scaling" if recipe.loss_scaling == "dynamic" else "no loss scaling"
    return f"{recipe.precision} ({scaling})"


def _show(value) -> str:
    """An option's value as it is typed on the command line (1024,1024 for a tuple)."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _data_shown(recipe: Recipe) -> str:
    """The checkpoint's data set as the user gave it (the IDX folder, not "idx")."""
    return f"--data-dir {recipe.data_dir}" if recipe.dataset == "idx" else recipe.dataset


def _resumed_recipe(args, recipe: Recipe) -> tuple:
    """``(recipe, note)``: the checkpoint's recipe with the options --resume may change, and
    a note to print once the run is known to go ahead (None when there is none)."""
    conflicts = []
    for name in _FIXED_ON_RESUME:
        given, saved = getattr(args, name), getattr(recipe, name)
        if given is not None and given != saved:
            conflicts.append(f"--{name.replace('_', '-')} {_show(given)} (the checkpoint has "
                             f"{_show(saved)})")
    if args.dataset is not None and (args.dataset == "digits") != (recipe.dataset == "digits"):
        conflicts.append(f"--dataset {args.dataset} (the checkpoint's run trained on "
                         f"{_data_shown(recipe)})")
    if conflicts:
        raise CLIError("--resume continues the checkpoint's run, but these options differ "
                       "from it: " + "; ".join(conflicts) + ". Fix: leave them out, or start "
                       "a new run without --resume.")
    note = None
    if args.epochs is not None and args.epochs != recipe.epochs:
        if recipe.schedule == "cosine":
            note = (f"note: --epochs {args.epochs} changes the run's {recipe.epochs} epochs: "
                    "the cosine schedule is stretched from here on, so the result differs "
                    f"from a run trained for {args.epochs} epochs from the start")
        recipe = dataclasses.replace(recipe, epochs=args.epochs)
    return recipe, note


def _check_same_examples(recipe: Recipe, ds, resume: Path):
    """A resumed run must see as many training examples per epoch as it did: the steps
    per epoch fix where the data order and the lr schedule stand."""
    have = len(ds.train[0])
    if recipe.train_examples is not None and have != recipe.train_examples:
        raise CLIError(f"--resume {resume}: its run trained on {recipe.train_examples} "
                       f"examples per epoch, but the data now has {have} ({ds.describe()}). "
                       "Resuming would put its steps, data order and learning-rate schedule "
                       "out of step. Fix: --data-dir with the data it was trained on, or a "
                       "new run without --resume.")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _quiet_unless_main(comm):
    """Under a launcher, only rank 0 prints (the others' output would repeat it N times)."""
    if comm.size > 1 and not comm.is_main:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this process


def _train(args) -> int:
    comm = distributed.init()  # size 1 unless started by mpiexec/mpirun
    _quiet_unless_main(comm)
    device = _select_backend(args.backend)
    if device == "cuda" and comm.size > 1:
        backend.use_device(comm.rank)
    if comm.size > 1:
        print(f"data parallel: {comm.size} ranks ({'NCCL' if device == 'cuda' else 'MPI'}), "
              "rank 0 reports and writes checkpoints", flush=True)
    resume = Path(args.resume) if args.resume is not None else None
    if resume is not None:
        recipe, resume_note = _resumed_recipe(args, _read_recipe(resume, "--resume"))
        if recipe.dataset == "digits":
            _no_data_dir_for_digits(args.data_dir, "the checkpoint's run trained on")
        _check_metrics(resume.parent / METRICS_FILE)
    elif args.dataset == "digits":
        _no_data_dir_for_digits(args.data_dir, "--dataset digits trains on")
    out = Path(args.out) if args.out is not None else (resume.parent if resume else None)
    output = None
    try:
        if out is not None and comm.is_main:  # a folder that cannot be written fails now
            output = RunFolder(out)
            output.check()
        if resume is not None:
            ds = _checkpoint_data(recipe, args.data_dir, "the data set (its four IDX files)",
                                  f"--resume {resume} --data-dir DIR",
                                  lambda folder: load_dataset(recipe.dataset, folder))
            _check_data_fits(recipe, ds.input_width, ds.classes, "--resume")
            _check_same_examples(recipe, ds, resume)
            if recipe.train_examples is None:  # a checkpoint from before it was recorded
                recipe = dataclasses.replace(recipe, train_examples=len(ds.train[0]))
        else:
            ds = load_dataset(args.dataset or DEFAULTS["dataset"], args.data_dir,
                              fallback=args.dataset is None)
            recipe = _fresh_recipe(args, ds)
        if ds.note:
            print(ds.note)
        print(ds.describe(), flush=True)
        if out is None:
            out = Path("runs") / _run_name(ds)
            if comm.is_main:
                output = RunFolder(out)
                output.check()

        if recipe.batch_size % comm.size:
            raise CLIError(_batch_over_ranks(recipe.batch_size, comm.size, resume))
        steps_per_epoch = num_batches(len(ds.train[0]), recipe.batch_size, drop_last=True)
        if steps_per_epoch == 0:
            raise CLIError(f"--batch-size {recipe.batch_size} is larger than the "
                           f"{len(ds.train[0])} training examples. Fix: a smaller --batch-size.")
        params = _check_model_fits(recipe)
        model, optimizer = recipe.model(), recipe.optimizer_for(steps_per_epoch)
        try:
            state = init_state(model, optimizer, recipe.in_shape, random.key(recipe.seed))
        except MemoryError as e:
            raise CLIError(f"--hidden {_show(recipe.hidden)}: the model's {params:,} parameters "
                           f"({_bytes(params * 4)} in float32) do not fit in memory ({e}). Fix: "
                           "smaller --hidden widths, e.g. --hidden 512,512.") from None
        if resume is not None:
            state = load_state(resume, like=state)
            if state.epoch > recipe.epochs:
                raise CLIError(f"{resume} has already trained {state.epoch} epochs, more than "
                               f"--epochs {recipe.epochs}. Fix: --epochs {state.epoch} or more.")
            if resume_note:
                print(resume_note)
            if state.epoch == recipe.epochs:
                print(f"note: {resume} has trained all {_plural(recipe.epochs, 'epoch')} of "
                      f"its run: nothing to train, it is only evaluated. Fix: --epochs "
                      f"{recipe.epochs + 1} or more to train longer.")
            else:
                print(f"resuming {resume} at epoch {state.epoch}, step {state.step}")
        history = None
        if output is not None:
            history = output.claim(args.overwrite, resume, state.epoch)
        print(f"model: {recipe.input_width} -> {' -> '.join(map(str, recipe.hidden))} "
              f"({recipe.activation}) -> {recipe.classes}; {recipe.optimizer} lr {recipe.lr:g} "
              f"{recipe.schedule}; {_precision_shown(recipe)}; "
              f"{_plural(recipe.epochs, 'epoch')} of "
              f"{_plural(steps_per_epoch, 'step')}; out {out}", flush=True)
        held, state = [state], None  # fit holds the only reference: it frees each old state
        try:
            result = fit(model, optimizer, _to_device(held.pop(), device), ds.train, ds.test,
                         epochs=recipe.epochs, batch_size=recipe.batch_size,
                         out_dir=out if comm.is_main else None, comm=comm,
                         metadata={"recipe": recipe.to_metadata()},
                         eval_batch_size=recipe.eval_batch_size,
                         compute_dtype=recipe.compute_dtype, compiled=device == "cuda",
                         progress=not args.no_progress and comm.is_main,
                         log=lambda line: print(line, flush=True), history=history,
                         overwrite=args.overwrite)
            interrupted = None
        except Interrupted as e:
            interrupted = e
        except OutDirConflict as e:  # files RunFolder let pass, but not of the resumed run
            raise CLIError(f"{e.out_dir} holds {names(e.files)}, which this run would "
                           "overwrite, and they are not the checkpoints of the run --resume "
                           "continues. Fix: --out NEW_DIR, or --overwrite to replace them."
                           ) from None
        except Diverged as e:
            raise CLIError(_diverged(e, recipe)) from None
        except BrokenPipeError:  # stdout closed (`| head`): not the folder's fault
            raise
        except OSError as e:  # a full disk or a folder made read-only while training
            raise CLIError(_write_failed(e, out, resume)) from None
    finally:
        if output is not None:  # the replaced files: deleted, or back if no epoch was saved
            # a signal now comes after the run and stops nothing: the clean-up runs whole
            with hold_interrupts(StopRequest()):
                output.close()
    if interrupted is not None:
        kept = interrupted.checkpoint or resume
        where = _continue_from(kept, out, resume)
        if kept:
            where = f"last full checkpoint: {kept} (epoch {interrupted.epoch}); {where}"
        return _report_stop(interrupted.signum, where)
    print(f"checkpoint: {result.checkpoint or resume}")
    print(f"test_accuracy={result.test.accuracy:.4f}")
    return EXIT_OK


def _batch_over_ranks(batch_size: int, ranks: int, resume: Path | None) -> str:
    """Why the global batch cannot be split over the ranks, with a fix that can be taken: a
    resumed run keeps its checkpoint's batch size, so there the rank count must change."""
    divisors = [n for n in range(ranks - 1, 0, -1) if batch_size % n == 0]
    fits = max(ranks, batch_size - batch_size % ranks)
    if resume is not None:
        return (f"the checkpoint's run trains on batches of {batch_size}, which cannot be "
                f"split evenly over {ranks} ranks (a resumed run keeps its batch size). Fix: "
                f"mpiexec -n {divisors[0]} (a count of ranks that divides {batch_size}), or a "
                f"new run with --batch-size {fits}.")
    return (f"--batch-size {batch_size} cannot be split evenly over {ranks} ranks. Fix: a "
            f"batch size divisible by {ranks}, e.g. --batch-size {fits}.")


def _continue_from(kept: Path | None, out: Path, resume: Path | None) -> str:
    """The command that continues a stopped run from ``kept`` (or its resumed start), with
    --overwrite where ``out`` holds what that resume would replace (later epochs a failed
    write left, or the files an --overwrite set aside and put back)."""
    kept = kept or resume
    if kept is None:
        return "no epoch finished, no checkpoint written"
    elsewhere = kept == resume and out.resolve() != resume.parent.resolve()
    return (f"continue with: fuseflow train --resume {kept}"
            + (f" --out {out}" if elsewhere else "")
            + (" --overwrite" if needs_overwrite(out, kept) else ""))


def _diverged(e: Diverged, recipe: Recipe) -> str:
    kept = (f"the last checkpoint saved is {e.checkpoint} (epoch {e.saved_epoch})"
            if e.checkpoint else "this run saved no epoch")
    return (f"epoch {e.epoch}'s training loss is {e.loss}: the run diverged, most likely because "
            f"--lr {recipe.lr:g} is too high for this model, and that epoch was not saved "
            f"({kept}). Fix: a new run with a smaller --lr, e.g. --lr {recipe.lr / 10:g} (a "
            "resumed run keeps its --lr)" + (", with --out NEW_DIR or --overwrite."
                                             if e.checkpoint else "."))


def _write_failed(e: OSError, out: Path, resume: Path | None) -> str:
    again = _continue_from(latest_checkpoint(out) if out.is_dir() else None, out, resume)
    return (f"cannot write the run's files in {out} ({e.strerror or e}"
            f"{': ' + str(e.filename) if e.filename else ''}). Every file saved before is "
            f"whole; {again}. Fix: free disk space or make {out} writable, then continue; or "
            "--out another folder.")


def _report_stop(signum: int, where: str) -> int:
    """Print a stopped run's last line; its exit code (130 Ctrl-C, 143 SIGTERM)."""
    if signum == signal.SIGTERM:
        print(f"terminated (SIGTERM): {where}", flush=True)
        return EXIT_TERMINATED
    print(f"interrupted: {where}", flush=True)
    return EXIT_INTERRUPTED


def _checkpoint_data(recipe: Recipe, data_dir, what: str, fix: str, load):
    """``load(folder)`` of ``--data-dir`` or else the folder the checkpoint's run read; that
    folder moved since is an error that names it and ``--data-dir``."""
    try:
        return load(data_dir or recipe.data_dir)
    except data.DatasetNotFoundError:
        if data_dir is not None or recipe.data_dir is None:
            raise
        raise CLIError(f"the checkpoint's run read its data from {recipe.data_dir}, which no "
                       f"longer holds {what}. Fix: {fix}, the folder that holds that data "
                       "now.") from None


def _eval(args) -> int:
    # under a launcher every rank evaluates the whole test set; rank 0 alone reports
    _quiet_unless_main(distributed.init())
    device = _select_backend(args.backend)
    path = Path(args.checkpoint)
    recipe = _read_recipe(path, "CKPT")
    if recipe.dataset == "digits":
        _no_data_dir_for_digits(args.data_dir, "the checkpoint's run trained on")
    x, y, source = _checkpoint_data(
        recipe, args.data_dir, "its test split (the IDX files t10k-images-idx3-ubyte and "
        "t10k-labels-idx1-ubyte)", "--data-dir DIR",
        lambda folder: _load_split(recipe.dataset, folder, "test"))
    bad = (y < 0) | (y >= recipe.classes)
    if int(x.shape[1]) == recipe.input_width and bad.any():
        i = int(np.argmax(bad))
        raise CLIError(f"{source.labels}: label {int(y[i])} at index {i} is outside the "
                       f"checkpoint's {recipe.classes} classes (0..{recipe.classes - 1}). Fix: "
                       "--data-dir with the data it was trained on; if this is that data, the "
                       "file is damaged: restore it from the original data set.")
    _check_data_fits(recipe, int(x.shape[1]), int(y.max()) + 1, "eval")
    model = recipe.model()
    like = init_state(model, recipe.optimizer_for(1), recipe.in_shape, random.key(0))
    params = _to_device(load_state(path, like=like), device).params
    x, y = backend.device_put((x, y), device) if device == "cuda" else (x, y)
    result = evaluate(model, params, x, y, args.batch_size or recipe.eval_batch_size)
    print(f"test_loss={result.loss:.4f} ({result.correct}/{result.count} correct)")
    print(f"test_accuracy={result.accuracy:.4f}")
    return EXIT_OK


def _bench(args) -> int:
    device = _select_backend(args.backend)
    recipe = Recipe(dataset="digits", data_dir=None, input_width=args.input_width,
                    classes=args.classes, hidden=tuple(args.hidden), activation=args.activation,
                    optimizer=args.optimizer, lr=DEFAULT_LR[args.optimizer], schedule="constant",
                    batch_size=args.batch_size, precision=args.precision,
                    loss_scaling=_loss_scaling(args.loss_scaling, args.precision))
    _check_model_fits(recipe, bench=True)
    model, optimizer = recipe.model(), recipe.optimizer_for(1)
    state = _to_device(init_state(model, optimizer, recipe.in_shape, random.key(0)), device)
    x = random.normal(random.key(1), (args.batch_size, args.input_width))
    y = random.randint(random.key(2), (args.batch_size,), 0, args.classes)
    if device == "cuda":
        x, y = backend.device_put((x, y), "cuda")
    step = make_step(model, unchecked_cross_entropy, optimizer,
                     compute_dtype=recipe.compute_dtype)
    if device == "cuda":
        # as `fuseflow train` runs it: one CUDA graph per step, the batch cast on its way in
        step = compile_step(step, cast_args=batch_casts(recipe.compute_dtype, x, 2))
    params, opt_state = state.params, state.opt_state
    for _ in range(args.warmup):
        params, opt_state, metrics = step(params, opt_state, x, y)
    if args.warmup > 0:
        float(metrics["loss"])  # wait for the warm-up to finish before the clock starts
    t0 = time.perf_counter()
    for _ in range(args.steps):
        params, opt_state, metrics = step(params, opt_state, x, y)
    float(metrics["loss"])  # wait for the device
    seconds = time.perf_counter() - t0
    print(f"model: {args.input_width} -> {' -> '.join(map(str, args.hidden))} -> "
          f"{args.classes}, batch {args.batch_size}, {args.optimizer}, {_precision_shown(recipe)}; "
          f"{args.steps} steps in {seconds:.3f}s")
    rate = args.steps / seconds
    print(f"steps_per_s={rate:.1f} samples_per_s={rate * args.batch_size:.0f} "
          f"ms_per_step={1e3 / rate:.2f}")
    return EXIT_OK


_COMMANDS = {"train": _train, "eval": _eval, "bench": _bench}
_REPORTED = (CLIError, RunFolderError, RecipeError, data.DatasetError, data.DatasetNotFoundError,
             checkpoint.CheckpointError, distributed.DistributedError)


def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)

    def show_warning(message, category, filename, lineno, file=None, line=None):
        print(f"fuseflow {args.command}: warning: {message}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show_warning  # one line, like the errors
        try:
            with sigterm_as_interrupt():  # clean-up (the --overwrite files) runs on SIGTERM
                return _COMMANDS[args.command](args)
        except _REPORTED as e:
            print(f"fuseflow {args.command}: error: {e}", file=sys.stderr, flush=True)
            distributed.abort_if_parallel(EXIT_ERROR)  # other ranks may wait on this one
            return EXIT_ERROR
        except PermissionError as e:  # a data file or checkpoint the command may not read
            what = f"{e.filename} ({e.strerror})" if e.filename else (e.strerror or str(e))
            print(f"fuseflow {args.command}: error: cannot open {what}. Fix: make it readable "
                  "(e.g. chmod u+r), or use a copy you can read.", file=sys.stderr, flush=True)
            distributed.abort_if_parallel(EXIT_ERROR)
            return EXIT_ERROR
        except MemoryError as e:
            print(f"fuseflow {args.command}: error: out of memory ({e or 'MemoryError'}). "
                  "Fix: smaller --hidden widths or --batch-size.", file=sys.stderr, flush=True)
            distributed.abort_if_parallel(EXIT_ERROR)
            return EXIT_ERROR
        except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            distributed.abort_if_parallel(EXIT_ERROR)
            return EXIT_ERROR
        except KeyboardInterrupt as e:
            signum = getattr(e, "signum", signal.SIGINT)
            code = _report_stop(signum, "no checkpoint written")
            # one rank alone: the others would wait
            distributed.abort_if_parallel(code, f"was stopped by {signal.Signals(signum).name}")
            return code


if __name__ == "__main__":
    sys.exit(main())
