"""Data-parallel training: the same model on every rank, each rank a shard of the batch.

Ranks are processes started by a launcher (``mpirun -np N python train.py`` or
``mpiexec``); ``init()`` reads the launcher's environment. Gradients are averaged with ONE
collective per step over a single flat buffer (all leaves packed together), so the
parameters stay identical on every rank. Two engines:

- CPU (NumPy arrays): MPI through mpi4py;
- GPU (CuPy arrays): NCCL through CuPy's bindings, its unique id shared over MPI.

A single process without a launcher gets a communicator of size 1, so a script written for
N ranks runs unchanged on one. Checkpoints: save from rank 0 only (``is_main``); load on
every rank (any number of ranks: parameters are replicated, not sharded).
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from fuseflow import backend, tree
from fuseflow._dtypes import bfloat16, is_float, is_half
from fuseflow._namespace import is_array, is_cupy, namespace

__all__ = ["Communicator", "DistributedError", "init", "launched_by_mpi"]

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                  "HYDRA_CONTROL_FD")


class DistributedError(RuntimeError):
    """Ranks disagree (model shapes, batch sizes) or the launcher set-up is unusable."""


def launched_by_mpi() -> bool:
    """True when this process was started by an MPI launcher (mpirun/mpiexec)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


class Communicator:
    """``rank``/``size`` and the few collectives data-parallel training needs."""

    def __init__(self, mpi_comm=None, *, always_reduce=False):
        """``always_reduce`` runs the collective even with one rank (to test the engine)."""
        self._mpi = mpi_comm
        self.always_reduce = always_reduce
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1
        self._nccl = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, logs and writes checkpoints."""
        return self.rank == 0

    def __repr__(self):
        return f"Communicator(rank={self.rank}, size={self.size})"

    # ---- collectives -------------------------------------------------------------------------
    def allreduce_mean(self, grads):
        """Average a pytree over ranks with one collective on one packed buffer. Leaves of
        several dtypes are packed in the widest, float16 in float32 (the ranks' sum would
        overflow where their mean does not), and come back in their own; complex leaves
        stay complex. An integer or bool leaf's mean stays fractional (float64); a Python
        number's comes back as a Python number."""
        if self.size == 1 and not self.always_reduce:
            return grads
        leaves, treedef = tree.flatten(grads)
        if not leaves:
            return grads
        xp = next((namespace(g) for g in leaves if is_array(g)), np)
        arrays = [g if is_array(g) else xp.asarray(g) for g in leaves]  # 3.0 is a 0-d array
        flat = xp.concatenate([g.reshape(-1) for g in arrays])
        # integer leaves only: their mean is fractional
        if not (is_float(flat.dtype) or flat.dtype.kind == "c"):
            flat = flat.astype(xp.float64)
        elif is_half(flat.dtype):
            flat = flat.astype(xp.float32)
        if is_cupy(flat):
            self._allreduce_nccl(flat)
        elif self._mpi is not None:
            from mpi4py import MPI

            self._mpi.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        flat /= self.size
        out, offset = [], 0
        for leaf, g in zip(leaves, arrays):
            mean = flat[offset:offset + g.size].reshape(g.shape)
            if g.dtype.kind != "c" and mean.dtype.kind == "c":
                mean = mean.real  # a real leaf packed with complex ones
            # floats come back in their own dtype; an integer leaf's mean stays fractional
            real = is_float(g.dtype) or g.dtype.kind == "c"
            mean = mean.astype(g.dtype if real else xp.float64, copy=False)
            out.append(mean if is_array(leaf) else mean.item())
            offset += g.size
        return tree.unflatten(treedef, out)

    def _allreduce_nccl(self, flat):
        if self._nccl is None:
            self._nccl = backend.nccl_sum(self.size, self.rank, self._mpi)
        # NCCL has no complex type: a complex sum is the sum of the real and imaginary
        # parts, which a real view of the same buffer holds side by side
        self._nccl(flat.view(flat.real.dtype) if flat.dtype.kind == "c" else flat)

    def broadcast(self, value, root=0):
        """Rank ``root``'s pytree on every rank (e.g. the initial params, or a whole
        TrainState). Ranks holding trees of different structure, shapes or dtypes, or
        naming different roots, get a DistributedError naming them (not MPI's message-size
        error from the middle of the transfer). Python numbers stay Python numbers."""
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < self.size:
            raise DistributedError(f"broadcast: root must be a rank, 0..{self.size - 1}, got "
                                   f"{root!r}. Fix: broadcast(value, root=0).")
        if self.size == 1:
            return value
        self.check_same("shapes of the tree to broadcast",
                        f"root {int(root)}: {_describe(value)}")
        leaves, treedef = tree.flatten(value)
        out = []
        for leaf in leaves:
            # A private copy: Bcast writes into it, never into the caller's array.
            host = leaf.get() if is_cupy(leaf) else np.array(leaf, order="C", copy=True)
            # MPI takes no bfloat16 buffer: its bytes, as uint16, land in host all the same
            self._mpi.Bcast(host.view(np.uint16) if host.dtype == bfloat16 else host,
                            root=int(root))
            # a step count (int) stays an int: a 0-d array would not go into JSON
            out.append(namespace(leaf).asarray(host) if is_array(leaf) else host.item())
        return tree.unflatten(treedef, out)

    def check_same(self, what: str, description: str,
                   fix: str = "start every rank with the same model and arguments."):
        """Raise on every rank (no hang) when ranks disagree about ``description``."""
        if self.size == 1:
            return
        digest = hashlib.sha256(description.encode()).hexdigest()[:16]
        everyone = self._mpi.allgather((digest, description))
        if len({d for d, _ in everyone}) > 1:
            lines = "\n".join(f"  rank {r}: {d}" for r, (_, d) in enumerate(everyone))
            raise DistributedError(f"ranks disagree about the {what}:\n{lines}\nFix: {fix}")

    def check_model(self, params):
        """All ranks must hold the same model: same tree, shapes and dtypes."""
        self.check_same("model shapes", _describe(params))

    def check_data(self, what: str, x, y):
        """All ranks must hold the same examples in the same order (each takes its share of
        every global batch): sizes, dtypes and a sample of rows compared, else every rank
        raises, where a rank with fewer batches would leave the others in a collective."""
        self.check_same(what, _fingerprint(x, y),
                        "give every rank the whole data set, the same arrays in the same "
                        "order: fit splits each global batch over the ranks itself.")

    def shard(self, *arrays):
        """This rank's contiguous share of a global batch (equal shares; the size must divide)."""
        if not arrays:
            raise DistributedError("shard: no arrays given. Fix: comm.shard(x, y).")
        n = len(arrays[0])
        if any(len(a) != n for a in arrays):
            raise DistributedError(f"shard: the arrays hold {[len(a) for a in arrays]} examples; "
                                   "they must hold the same number (one label per example), or "
                                   "the ranks' shares would not line up. Fix: pass x and y of "
                                   "the same global batch.")
        if n % self.size:
            # equal shares: the mean of the ranks' mean gradients is the global batch's
            lo, hi = n - n % self.size, n - n % self.size + self.size
            sizes = f"{lo} or {hi}" if lo else f"{hi}"
            raise DistributedError(f"shard: a global batch of {n} cannot be split evenly over "
                                   f"{self.size} ranks. Fix: a batch size that is a multiple "
                                   f"of {self.size}, e.g. {sizes}; if {n} is only the smaller "
                                   "last batch of an epoch, drop_last=True in "
                                   "ff.data.batches.")
        k = n // self.size
        parts = tuple(a[self.rank * k:(self.rank + 1) * k] for a in arrays)
        return parts if len(parts) > 1 else parts[0]

    def barrier(self):
        if self._mpi is not None:
            self._mpi.Barrier()


def _describe(value):
    """Every leaf's path, shape and dtype: what ranks must agree on."""
    return "; ".join(f"{p} {np.shape(x)} {_dtype(x)}"
                     for p, x in tree.leaves_with_paths(value)) or "(an empty tree)"


def _fingerprint(x, y) -> str:
    """The examples' count, shapes and dtypes, and a hash of up to 256 evenly spaced rows of
    each (a cheap read, also of device arrays)."""
    n = len(x)
    rows = np.unique(np.linspace(0, max(n - 1, 0), min(n, 256)).astype(np.int64))
    digest = hashlib.sha256()
    for a in (x, y):
        sample = a[namespace(a).asarray(rows)] if n else a
        digest.update(np.ascontiguousarray(sample.get() if is_cupy(sample) else sample).tobytes())
    return (f"{n} examples, x {tuple(x.shape[1:])} {_dtype(x)}, y {tuple(y.shape[1:])} "
            f"{_dtype(y)}, rows sampled: sha256 {digest.hexdigest()[:16]}")


def _dtype(x):
    """A leaf's dtype; a Python number's as NumPy would store it."""
    return x.dtype if hasattr(x, "dtype") else np.result_type(x)


def init() -> Communicator:
    """The communicator for this process: MPI's world when launched by MPI, else size 1."""
    if not launched_by_mpi():
        return Communicator(None)
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError("this process was started by an MPI launcher but mpi4py is not "
                               "installed. Fix: pip install 'fuseflow[mpi]'") from e
    _abort_on_uncaught_exception(MPI.COMM_WORLD)
    _share_cpu_threads(MPI)
    return Communicator(MPI.COMM_WORLD)


#: Thread counts a user may have set; then the BLAS threads are theirs to choose.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS")


def _share_cpu_threads(MPI):
    """Each rank's BLAS starts one thread per core: N ranks on one machine oversubscribe it
    N times over (two ranks on 2 cores trained 10-15x slower than one process). Unless the
    user set a thread count, each rank of a machine gets its share of the cores."""
    if any(v in os.environ for v in _THREAD_VARS):
        return
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    ranks = local.Get_size()
    local.Free()
    if ranks < 2:
        return
    cores = os.cpu_count() or 1
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency, and ours

    threadpool_limits(max(1, min(mine, cores // ranks)), user_api="blas")


def abort_if_parallel(code: int = 1, what: str = "stopped with an error") -> None:
    """End the whole job (MPI_Abort) when this process is one of several MPI ranks: an error
    reported on one rank only (a folder check, say) would otherwise leave the other ranks
    waiting in their next collective. ``what`` completes "rank N ..." in the line printed
    first (a signal is not an error). A no-op in a single process."""
    if not launched_by_mpi():
        return
    try:
        from mpi4py import MPI
    except ImportError:
        return
    world = MPI.COMM_WORLD
    if MPI.Is_initialized() and world.Get_size() > 1:
        _abort(world, what, code)


def _abort(comm, what: str, code: int = 1):
    """Say which rank ends the job and why, then MPI_Abort every rank."""
    import sys

    sys.stderr.write(f"fuseflow.distributed: rank {comm.Get_rank()} {what}; aborting all "
                     f"{comm.Get_size()} ranks\n")
    sys.stderr.flush()
    # the launcher forwards each rank's stderr through a pipe and stops reading it once
    # the abort kills the job: give it a moment so these last lines are not lost
    time.sleep(0.5)
    comm.Abort(code)


def _abort_on_uncaught_exception(comm):
    """A rank that dies of an exception takes the job down (MPI_Abort) instead of leaving
    the other ranks waiting forever in their next collective."""
    import sys

    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        _abort(comm, "failed")

    sys.excepthook = hook
