"""The folder a ``fuseflow train`` run writes to, and the promise that nothing saved in it
is lost by accident: a run never replaces another run's files (or the later epochs of the
run it resumes) unless asked, and when asked it sets them aside until its first epoch is
saved, putting them back if it stops before (``RunFolder``)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, the folder is not guarded against a 2nd run
    fcntl = None

from fuseflow import checkpoint
from fuseflow._files import fsync_dir
from fuseflow.train._checkpoints import LAST, epoch_checkpoint
from fuseflow.train._records import CURVES_FILE, METRICS_FILE, kept_metrics, read_metrics
from fuseflow.train._signals import hold_interrupts

__all__ = ["RunFolder", "RunFolderError", "fit_folder", "latest_checkpoint", "names",
           "needs_overwrite"]


class RunFolderError(Exception):
    """The output folder cannot be used as asked; the message says why and how to fix it."""


def make_writable_folder(out: Path, option: str, error=OSError, fix: str | None = None
                         ) -> Path | None:
    """Create ``out`` (and its parents) and write a probe file in it, before any training,
    so that an unusable folder is found before an epoch's work, not at its first save.
    Returns the outermost folder made (None if ``out`` existed); raises ``error`` naming
    ``option`` (``--out`` for the CLI, ``fit: out_dir`` for ``fit``) and how to give another
    (``fix``: ``--out `` or ``out_dir=``)."""
    fix = option + " " if fix is None else fix
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise error(f"{option} {out}: {blocker} is a file, so no folder can be made inside "
                        f"it. Fix: {fix}a path whose parent folders are folders.") from None
        what = "write in" if out.is_dir() else "create"
        raise error(f"{option} {out}: cannot {what} this folder ({e.strerror or e}). Fix: "
                    f"{fix}a folder you can write to, e.g. in your home folder.") from None
    return missing[-1] if missing else None


#: The hidden file a run holds an exclusive lock on (``fcntl.flock``) while it writes to its
#: folder, so that a second run given the same ``--out`` is refused instead of writing its
#: checkpoints and metrics over the first's.
LOCK_FILE = ".fuseflow.lock"


def _lock(folder: Path) -> int | None:
    """Lock ``folder`` for this process (see ``LOCK_FILE``); returns the lock file's
    descriptor, or None where advisory locks are unavailable: no ``fcntl`` (Windows), or a
    file system without flock (Lustre mounted without it, some FUSE mounts), with a
    warning."""
    if fcntl is None:
        return None
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:  # another user's lock file: reading is enough to lock it
            fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()  # "" if just locked
            os.close(fd)
            holder = f" (process {holder})" if holder.isdigit() else ""
            raise RunFolderError(
                f"--out {folder}: another fuseflow run{holder} is writing to this "
                "folder, and two runs in one folder would overwrite each other's checkpoints "
                "and metrics. Fix: wait until it ends, or --out NEW_DIR.") from None
        except OSError as e:  # ENOSYS, EOPNOTSUPP, ENOLCK: no locks on this file system
            os.close(fd)
            _remove_lock_file(folder)
            warnings.warn(f"--out {folder}: this file system does not lock files "
                          f"({e.strerror or e}), so nothing stops a second run from writing "
                          "to the same folder: give each run its own --out", stacklevel=2)
            return None
        try:  # the holder before us may have removed the file between our open and flock
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:  # the holder's pid, for the message a second run gets (best effort)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return fd


def _remove_lock_file(folder: Path):
    """Remove ``LOCK_FILE``, if this process can: one left behind holds nothing."""
    try:
        (folder / LOCK_FILE).unlink(missing_ok=True)
    except OSError:  # a folder made read-only meanwhile: the lock still ends with the fd
        pass


_EPOCH_FILE = re.compile(r"^ckpt-epoch(\d+)\.safetensors$")


def _epoch_files(folder: Path) -> dict:
    """``{N: path}`` of the ``ckpt-epoch{N}.safetensors`` files in ``folder``."""
    return epoch_files(folder.iterdir()) if folder.is_dir() else {}


def _run_files(folder: Path) -> list:
    """The files of a run in ``folder``: every ``ckpt-epoch{N}.safetensors``,
    ``last.safetensors``, ``metrics.jsonl`` (unless empty) and ``curves.png``."""
    files = [p for _, p in sorted(_epoch_files(folder).items())]
    for name in (LAST, METRICS_FILE, CURVES_FILE):
        path = folder / name
        if path.exists() and not (name == METRICS_FILE and path.stat().st_size == 0):
            files.append(path)
    return files


def _saved_epoch(path: Path) -> int | None:
    """The epoch a checkpoint holds: from the metrics ``fit`` writes into its metadata, else
    (a ``save_state`` file) from the state itself; None if unreadable."""
    try:
        metrics = checkpoint.read_metadata(path).get("metrics")
        if isinstance(metrics, dict) and "epoch" in metrics:
            return int(metrics["epoch"])
        return int(checkpoint.load(path).epoch)
    except (checkpoint.CheckpointError, OSError, AttributeError, KeyError, TypeError,
            ValueError):
        return None


def latest_checkpoint(folder: Path) -> Path | None:
    """The folder's newest checkpoint: last.safetensors, unless a ckpt-epoch file is newer."""
    epochs = _epoch_files(folder)
    last = folder / LAST
    if last.is_file() and (not epochs or (_saved_epoch(last) or 0) >= max(epochs)):
        return last
    return epochs[max(epochs)] if epochs else None


def needs_overwrite(folder: Path, resume: Path) -> bool:
    """Whether a run resumed from ``resume`` into ``folder`` must pass --overwrite: its own
    folder holds files or records of later epochs (a write that failed half-way can leave
    them), another folder any run's files."""
    if not folder.is_dir():
        return False
    if folder.resolve() != resume.parent.resolve():
        return bool(_run_files(folder))
    later, later_records = _after_epoch(folder, _saved_epoch(resume) or 0, resume)
    return bool(later or later_records)


def _after_epoch(folder: Path, epoch: int, resume: Path | None = None):
    """(checkpoints in ``folder`` that hold epochs after ``epoch``, whether metrics.jsonl
    records any): what a run continuing after ``epoch`` there would replace or cut.
    ``resume``, if it is the folder's last.safetensors, is the run's own start, not later."""
    later = [p for n, p in sorted(_epoch_files(folder).items()) if n > epoch]
    last = folder / LAST
    if last.exists() and not (resume is not None and _same_file(last, resume)):
        last_epoch = _saved_epoch(last)
        if last_epoch is None or last_epoch > epoch:  # unreadable counts as later
            later.append(last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        later_records = any(r.get("epoch", 0) > epoch
                            for r in read_metrics(folder / METRICS_FILE))
    return later, later_records


def _is_own(folder: Path, state) -> bool:
    """Whether ``folder`` holds the run ``state`` continues: its checkpoint of the state's
    epoch (for a state at an epoch's end) or its last.safetensors holds exactly ``state``,
    as one does when the state was resumed from it (or, for a state saved in the middle of
    an epoch, saved there as last.safetensors). Files under other names do not count: a
    copy of any run's state can be put there, and nothing in a mid-epoch state tells which
    run's earlier epochs it continues (two runs of one seed share their keys)."""
    at_epoch_end = state.epoch > 0 and state.batch_in_epoch == 0
    files = [epoch_checkpoint(folder, state.epoch)] if at_epoch_end else []
    files.append(folder / LAST)
    return checkpoint.find_exact([p for p in files if p.is_file()], state) is not None


def fit_folder(folder, state) -> tuple:
    """(whether ``folder`` holds the run ``state`` continues, the run files there that
    ``fit`` would overwrite or cut).

    The folder is the run's own if one of its checkpoints holds exactly this state (see
    ``_is_own``): then its checkpoints of later epochs count, and metrics.jsonl if it
    records any. Any other folder's run files are another run's: all of them count.
    """
    folder = Path(folder)
    if not _is_own(folder, state):
        return False, _run_files(folder)
    later, later_records = _after_epoch(folder, state.epoch)
    return True, later + ([folder / METRICS_FILE] if later_records else [])


def epoch_files(files) -> dict:
    """``{N: path}`` of the ``ckpt-epoch{N}.safetensors`` files among ``files``."""
    return {int(m.group(1)): p for p in files if (m := _EPOCH_FILE.match(p.name))}


def names(files) -> str:
    """``ckpt-epoch2..9.safetensors (8 files), last.safetensors`` for the messages."""
    epochs = sorted(epoch_files(files))
    others = [p.name for p in files if not _EPOCH_FILE.match(p.name)]
    if len(epochs) > 3:
        listed = [f"ckpt-epoch{epochs[0]}..{epochs[-1]}.safetensors ({len(epochs)} files)"]
    else:
        listed = [f"ckpt-epoch{n}.safetensors" for n in epochs]
    return ", ".join(listed + others)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class RunFolder:
    """The folder one ``fuseflow train`` writes to, and the promise that nothing saved in
    it is lost by accident.

    ``check()`` (as early as the folder is known) makes sure it is, or can be made, a folder
    this process can write in. ``claim()`` (just before training) refuses to replace any run
    file (every ``ckpt-epoch{N}``, ``last``, ``metrics.jsonl``, ``curves.png``) of another
    run, or the later epochs of the run a ``--resume`` continues in place, unless
    ``--overwrite``. With ``--overwrite`` those files are not deleted up front: they are
    moved into a ``replaced-<time>-<random>/`` folder inside the output folder, and
    ``close()`` (when the command ends, however it ends) deletes that folder if the new run
    has saved at least one epoch, or else moves the files back. Only a kill that allows no
    clean-up (SIGKILL, power loss) leaves the folder behind, with the old files intact.
    """

    def __init__(self, path: Path):
        self.path = path
        self.made = None       # the outermost folder this command created, if any
        self.backup = None     # where replaced files wait (--overwrite)
        self.kept = set()      # names of run files left in place by claim()
        self.start_epoch = None
        self.closed = False
        self.lock = None       # the lock file's descriptor while this run holds the folder

    def check(self):
        out = self.path
        if out.exists() and not out.is_dir():
            raise RunFolderError(f"--out {out} is a file, but --out names the folder a run "
                                 "writes to. Fix: --out a folder path (it is created if "
                                 f"missing), e.g. --out {out.with_name(out.name + '-run')}.")
        self.made = make_writable_folder(out, "--out", RunFolderError)
        if self.lock is None:
            try:
                self.lock = _lock(out)
            except OSError as e:
                raise RunFolderError(f"--out {out}: cannot lock this folder ({e.strerror or e})."
                                     " Fix: --out a folder you can write to.") from None

    def claim(self, overwrite: bool, resume: Path | None, start_epoch: int):
        """Refuse or set aside what the run would replace (see the class); returns the
        records of the epochs so far when a resumed run continues in a new folder (``fit``'s
        ``history``), else None."""
        out = self.path
        same_run = resume is not None and out.resolve() == resume.parent.resolve()
        if same_run:
            moved, copied = self._later_epochs(resume, start_epoch)
            replaced = moved + copied
        else:
            moved, copied = _run_files(out), []
            replaced = moved
        if replaced and not overwrite:
            raise RunFolderError(self._refusal(replaced, resume, start_epoch, same_run))
        for left in sorted(p for p in out.glob("replaced-*") if p.is_dir()):
            print(f"note: {left} holds files an earlier --overwrite set aside and could not "
                  "put back or delete (its process was killed); move them back, or delete "
                  "the folder", flush=True)
        if replaced:
            self._set_aside(moved, copied)
        self.kept = {p.name for p in _run_files(out)}
        self.start_epoch = start_epoch
        if resume is None or same_run:
            return None
        # carried into the new folder; a torn last line is dropped with its warning, the
        # only one this run gives (fit reads the records from here, not the file)
        return kept_metrics(resume.parent, start_epoch)

    def _later_epochs(self, resume: Path, epoch: int):
        """The files of epochs after ``epoch`` in the resumed checkpoint's own folder: (files
        a continuation would replace, files it would rewrite keeping epochs <= ``epoch``)."""
        out = self.path
        moved, later_records = _after_epoch(out, epoch, resume)
        copied = []
        if later_records or moved:
            copied = [out / n for n in (METRICS_FILE, CURVES_FILE) if (out / n).is_file()]
            if not later_records:
                copied = [p for p in copied if p.name != METRICS_FILE]
        return moved, copied

    def _refusal(self, replaced, resume, epoch, same_run) -> str:
        out = self.path
        if same_run:
            latest = latest_checkpoint(out)
            other = (f" --resume {latest} to continue from the latest epoch," if latest and
                     not _same_file(latest, resume) else "")
            return (f"--resume {resume} continues the run after epoch {epoch}, but {out} "
                    f"already holds later epochs of it ({names(replaced)}), which this run "
                    f"would overwrite. Fix: --out NEW_DIR to continue in another folder,"
                    f"{other} or --overwrite to replace them.")
        latest = latest_checkpoint(out)
        cont = f" --resume {latest} to continue it," if latest and resume is None else ""
        return (f"{out} already holds a run ({names(replaced)}). Fix:{cont} --out NEW_DIR, "
                "or --overwrite to replace it.")

    def _set_aside(self, moved, copied):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.backup = Path(tempfile.mkdtemp(prefix=f"replaced-{stamp}-", dir=self.path))
        with hold_interrupts():  # all of them or, after a Ctrl-C here, still all of them
            for p in copied:
                shutil.copy2(p, self.backup / p.name)
            for p in moved:
                os.replace(p, self.backup / p.name)
            fsync_dir(self.backup)
            fsync_dir(self.path)
        kept = (f"{names(moved)} moved" if moved else "") + \
            (" and " if moved and copied else "") + (f"{names(copied)} copied" if copied else "")
        print(f"overwrite: {kept} to {self.backup}; deleted when this run has saved an epoch, "
              "put back if it stops before", flush=True)

    def close(self):
        """Delete the replaced files if the new run saved an epoch, else put them back and
        remove what this command created; idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close()
        finally:
            # the lock file goes first and the lock last: a run that opened the file
            # meanwhile sees it gone and makes a new one, and no run can take the folder
            # before the folders this command made are removed
            if self.lock is not None:
                _remove_lock_file(self.path)
            try:
                self._remove_made()
            finally:
                if self.lock is not None:
                    os.close(self.lock)
                    self.lock = None

    def _close(self):
        out = self.path
        saved = self.start_epoch is not None and \
            any(n > self.start_epoch for n in _epoch_files(out))
        if saved:
            if self.backup is not None:
                shutil.rmtree(self.backup, ignore_errors=True)
            return
        with hold_interrupts():
            for name in (METRICS_FILE, CURVES_FILE):  # made by this command, no epoch in them
                path = out / name
                if self.start_epoch is not None and name not in self.kept and path.is_file():
                    path.unlink()
            if self.backup is not None:
                for p in self.backup.iterdir():
                    os.replace(p, out / p.name)
                self.backup.rmdir()
                fsync_dir(out)
                print(f"overwrite: no epoch was saved; the replaced files are back in {out}",
                      flush=True)

    def _remove_made(self):
        out = self.path
        if self.made is not None:  # remove the folders made here, if still empty
            for folder in (out, *out.parents):
                try:
                    folder.rmdir()
                except OSError:
                    break
                if folder == self.made:
                    break
