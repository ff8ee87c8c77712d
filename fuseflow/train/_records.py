"""What a run leaves in its output folder besides checkpoints: ``metrics.jsonl`` and
``curves.png``.

``metrics.jsonl`` holds one JSON object per finished epoch (keys in ``FIELDS``), appended
and fsynced as each epoch ends, so a run that is stopped keeps every epoch it finished. A
crash in the middle of an append can leave the last line cut short: reading skips it with a
warning instead of refusing the whole file. A resumed run first drops the lines of epochs
after its checkpoint (they belong to the abandoned continuation), so the file always
describes the one run the checkpoints hold. A value that is not finite (the loss of a
diverged run) is written as ``null``, so every line is strict JSON that any tool reads.
``curves.png`` is redrawn from the file after every epoch.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from fuseflow._files import atomic_write

__all__ = ["FIELDS", "METRICS_FILE", "CURVES_FILE", "read_metrics", "kept_metrics",
           "write_metrics", "append_metrics", "plot_curves"]

FIELDS = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "seconds",
          "samples_per_s")
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


def read_metrics(path) -> list[dict]:
    """The records of a ``metrics.jsonl`` file, or of the one in a run folder (an empty
    list when there is none).

    A last line that is cut short (no newline at its end, not valid JSON) is what a crash in
    the middle of appending leaves: it is skipped with a ``RuntimeWarning``, and a run
    that continues drops it. Any other line that is not a JSON
    object is a ``ValueError`` naming the file and the line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    # utf-8-sig: an editor that saves with a byte-order mark leaves the records readable
    lines = path.read_bytes().decode("utf-8-sig", errors="replace").split("\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"found a JSON {type(record).__name__}")
        except ValueError as e:
            shown = _shown(line)
            if n == len(lines):  # the last line, and no newline after it: a torn append
                warnings.warn(f"{path}:{n}: the last line is cut short ({shown!r}), as a "
                              "write interrupted by a crash leaves it; it is ignored (a run "
                              "that continues here drops it)", RuntimeWarning, stacklevel=2)
                continue
            raise ValueError(f"{path}:{n}: expected one JSON object per line, got {shown!r} "
                             f"({e}). Fix: delete or repair that line (the file is plain "
                             "text), or delete the file to start a new record.") from None
        epoch = record.get("epoch", 0)
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ValueError(f"read_metrics: {path}:{n}: expected \"epoch\" to be an integer "
                             f"(the epoch the line records), got {epoch!r} in "
                             f"{_shown(line)!r}. Fix: write the epoch number there, or delete "
                             "that line.")
        records.append(record)
    return records


def _shown(line: str) -> str:
    """A line of metrics.jsonl as an error quotes it: 60 characters at most."""
    return line if len(line) <= 60 else line[:57] + "..."


def kept_metrics(out_dir, completed_epochs: int) -> list[dict]:
    """The records of ``out_dir``'s metrics.jsonl for epochs ``<= completed_epochs``: what
    a run continuing there keeps (it rewrites the file with its first epoch)."""
    path = Path(out_dir) / METRICS_FILE
    return [r for r in read_metrics(path) if r.get("epoch", 0) <= completed_epochs]


def _line(record: dict) -> str:
    """One record as a line of strict JSON: NaN and infinities become null."""
    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v
    return json.dumps(finite(record), allow_nan=False) + "\n"


def write_metrics(out_dir, records: list) -> None:
    """Replace metrics.jsonl with ``records``, atomically."""
    with atomic_write(Path(out_dir) / METRICS_FILE, "w") as f:
        f.write("".join(_line(r) for r in records))


def append_metrics(out_dir, record: dict) -> None:
    with open(Path(out_dir) / METRICS_FILE, "a") as f:
        f.write(_line(record))
        f.flush()
        os.fsync(f.fileno())  # on disk with the epoch's checkpoints, not some time later


def plot_curves(records: list[dict], path) -> None:
    """Loss and accuracy (train and test) against epoch, as a PNG.

    Drawn on a bare Agg canvas rather than through pyplot: no global backend switch, no
    figure registry, nothing left open in a long-running process.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    records = [r for r in records if isinstance(r.get("epoch"), (int, float))]  # plottable
    epochs = [r["epoch"] for r in records]
    for ax, what, label in ((fig.add_subplot(1, 2, 1), "loss", "loss"),
                            (fig.add_subplot(1, 2, 2), "acc", "accuracy")):
        for split, style in (("train", "o-"), ("test", "s-")):
            pts = [(e, r[f"{split}_{what}"]) for e, r in zip(epochs, records)
                   if r.get(f"{split}_{what}") is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=split)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_lines():  # a panel with nothing to draw (no accuracy) has no legend
            ax.legend()
        # a log scale shows cross-entropy's long tail, but only positive values: a custom
        # loss may go below zero (a Gaussian negative log-likelihood), then it stays linear
        values = [v for line in ax.get_lines() for v in line.get_ydata()]
        if what == "loss" and values and min(values) > 0:
            ax.set_yscale("log")
    fig.tight_layout()
    with atomic_write(path) as f:  # a plot cut short by Ctrl-C leaves the previous one
        fig.savefig(f, format="png")
