"""Data parallel on CPU: 2 MPI ranks give the same parameters as one process after 20 steps."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff

SCRIPT = Path(__file__).parent / "mpi" / "train_equivalence.py"


def mpiexec():
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
    if exe is None:
        pytest.skip("no mpiexec (pip install 'fuseflow[mpi]')")
    pytest.importorskip("mpi4py")
    return exe


def run(cmd, tmp_path, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path, check=False)


def test_two_ranks_match_one_process(tmp_path):
    """Two ranks (each its half of every batch, the mean gradient over MPI) give one
    process's params after 20 float32 Adam steps: bit for bit against one process that
    forms the two halves' gradients and averages them the same way, and to float32 rounding
    against the whole batch's gradient (its sums add in another order: a few ulps after 20
    steps, up to 1.7e-7 at values up to 0.75 with mpich 5.0.2 and NumPy 2.4.6). Each rank
    starts from its own init (``--bad-init``): the broadcast must make them one."""
    exe = mpiexec()
    script = [sys.executable, str(SCRIPT)]
    runs = {"one": (script, []), "emulated": (script, ["--emulate-ranks", "2"]),
            "two": ([exe, "-n", "2", *script], ["--bad-init"])}
    out = {}
    for name, (cmd, flags) in runs.items():
        path = tmp_path / f"{name}.safetensors"
        res = run([*cmd, str(path), *flags], tmp_path)
        assert res.returncode == 0, res.stderr
        out[name] = ff.tree.leaves(ff.checkpoint.load(path))
    for one, emulated, two in zip(out["one"], out["emulated"], out["two"]):
        np.testing.assert_array_equal(two, emulated)
        np.testing.assert_allclose(two, one, rtol=0,
                                   atol=16 * np.finfo(np.float32).eps * np.abs(one).max())


@pytest.mark.parametrize("flag,what", [("--bad-model", "the model shapes"),
                                       ("--bad-broadcast", "the shapes of the tree to broadcast")])
def test_ranks_with_different_models_fail_clearly(tmp_path, flag, what):
    """Found by check_model, or by broadcast itself before it sends anything (MPI's own
    message-size error would not say which ranks or leaves differ)."""
    exe = mpiexec()
    res = run([exe, "-n", "2", sys.executable, str(SCRIPT), str(tmp_path / "x.safetensors"),
               flag], tmp_path, timeout=60)
    assert res.returncode != 0
    out = res.stderr + res.stdout
    assert f"ranks disagree about {what}" in out and "rank 1: " in out, out
    assert "MPI_Bcast" not in out, out


def test_a_rank_that_dies_ends_the_job_instead_of_hanging(tmp_path):
    exe = mpiexec()
    res = run([exe, "-n", "2", sys.executable, str(SCRIPT), str(tmp_path / "x.safetensors"),
               "--die"], tmp_path, timeout=60)  # a hang would hit the timeout and fail
    assert res.returncode != 0
    assert "simulated failure on rank 1" in res.stderr
    assert "rank 1 failed; aborting all 2 ranks" in res.stderr


@pytest.mark.parametrize("when", ["step", "save"])
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_epoch(tmp_path, when):
    """SIGTERM to rank 1 after a step, or to rank 0 while it saves an epoch."""
    exe = mpiexec()
    res = run([exe, "-n", "2", sys.executable, str(Path(__file__).parent / "mpi" /
                                                    "stop_signal.py"), str(tmp_path / "run"),
               when], tmp_path, timeout=120)  # a rank left waiting would hit the timeout
    assert res.returncode == 0, res.stderr
    assert "rank 0 stopped after epoch 2 by SIGTERM" in res.stdout, res.stdout
    assert "rank 1 stopped after epoch - by SIGTERM" in res.stdout, res.stdout
    assert ff.checkpoint.read_metadata(tmp_path / "run" / "last.safetensors")[
        "metrics"]["epoch"] == 2


def test_an_error_on_rank_0_alone_ends_the_job(tmp_path):
    """The output-folder checks run on rank 0 only: its one-line error must end the job,
    not leave rank 1 waiting in its first collective."""
    exe = mpiexec()
    args = [sys.executable, "-m", "fuseflow", "train", "--dataset", "digits", "--epochs", "1",
            "--batch-size", "64", "--no-progress", "--out", "run"]
    assert run(args, tmp_path).returncode == 0
    res = run([exe, "-n", "2", *args], tmp_path, timeout=60)  # a hang hits the timeout
    assert res.returncode != 0
    assert "run already holds a run" in res.stderr and "Traceback" not in res.stderr


def test_stop_votes_count_only_what_each_rank_had_when_it_voted():
    """A signal that lands on a rank while it waits in the vote is kept for the next epoch's
    vote: stopping on it now would stop that rank alone."""
    import signal

    from fuseflow.train._fit import _agree_on_stop
    from fuseflow.train._signals import interrupt_between_steps

    class Comm:  # one rank's view: the other rank votes ``theirs``
        def __init__(self, stop, theirs, arrives=None):
            self.stop, self.theirs, self.arrives = stop, np.array(theirs, float), arrives

        def allreduce_mean(self, mine):
            if self.arrives is not None:
                self.stop.signum = self.arrives  # the handler, during the collective
            return (mine + self.theirs) / 2

    with interrupt_between_steps() as stop:
        assert _agree_on_stop(stop, Comm(stop, [0, 0], arrives=signal.SIGTERM)) is None
        assert stop.signum == signal.SIGTERM  # kept for the next vote
        assert _agree_on_stop(stop, Comm(stop, [0, 0])) == signal.SIGTERM
        stop.signum = None
        assert _agree_on_stop(stop, Comm(stop, [1, 0])) == signal.SIGINT  # the other rank's
        assert _agree_on_stop(stop, Comm(stop, [0, 1])) == signal.SIGTERM


def test_single_process_communicator_is_a_no_op():
    comm = ff.distributed.Communicator(None)
    g = {"w": np.ones(3)}
    assert comm.allreduce_mean(g) is g and comm.size == 1 and comm.is_main
    comm.size = 2  # pretend: shard needs a batch divisible by the world size
    with pytest.raises(ff.distributed.DistributedError, match="cannot be split evenly"):
        comm.shard(np.ones(3))


@pytest.mark.gpu
def test_nccl_all_reduce_with_one_rank_on_one_gpu():
    """The GPU engine end to end with the ranks this machine has (one): NCCL communicator,
    one packed all-reduce, gradients back in their tree."""
    if not ff.backend.cuda_available():
        pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU")
    import cupy

    comm = ff.distributed.Communicator(None, always_reduce=True)
    grads = {"w": cupy.arange(12, dtype=cupy.float32).reshape(3, 4),
             "b": [cupy.ones(5, cupy.float32)]}
    out = comm.allreduce_mean(grads)
    assert comm._nccl is not None
    for a, b in zip(ff.tree.leaves(out), ff.tree.leaves(grads)):
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))


def test_cli_under_mpiexec_trains_like_one_process_and_only_rank_0_speaks(tmp_path):
    exe = mpiexec()
    args = ["-m", "fuseflow", "train", "--dataset", "digits", "--epochs", "2", "--batch-size",
            "64", "--no-progress"]
    one = run([sys.executable, *args, "--out", "one"], tmp_path)
    two = run([exe, "-n", "2", sys.executable, *args, "--out", "two"], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert "data parallel: 2 ranks (MPI)" in two.stdout
    assert two.stdout.count("test_accuracy=") == 1  # rank 1 is quiet
    assert one.stdout.splitlines()[-1] == two.stdout.splitlines()[-1]
    ev = run([exe, "-n", "2", sys.executable, "-m", "fuseflow", "eval",
              "two/last.safetensors"], tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert ev.stdout.count("test_accuracy=") == 1  # eval too: rank 0 alone reports
    assert ev.stdout.splitlines()[-1] == two.stdout.splitlines()[-1]
    import json

    # Loose: two epochs of Adam amplify the rounding differences of half-batch matmuls (seen:
    # 6e-5); the strict 1e-6 parameter check is test_two_ranks_match_one_process.
    for a, b in zip((tmp_path / "one" / "metrics.jsonl").read_text().splitlines(),
                    (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()):
        ra, rb = json.loads(a), json.loads(b)
        assert abs(ra["train_loss"] - rb["train_loss"]) < 1e-3 * ra["train_loss"]
        assert abs(ra["test_loss"] - rb["test_loss"]) < 1e-3 * ra["test_loss"]


def test_cli_batch_that_does_not_split_over_the_ranks_is_a_clear_error(tmp_path):
    exe = mpiexec()
    res = run([exe, "-n", "3", sys.executable, "-m", "fuseflow", "train", "--dataset", "digits",
               "--epochs", "1", "--batch-size", "64", "--no-progress"], tmp_path, timeout=60)
    assert res.returncode != 0
    assert "--batch-size 64 cannot be split evenly over 3 ranks" in res.stderr
    assert "Traceback" not in res.stderr


MISUSE = Path(__file__).parent / "mpi" / "fit_misuse.py"


@pytest.mark.parametrize("mode, says", [
    ("len", ["ranks disagree about the training set", "rank 0: 1438 examples",
             "rank 1: 1000 examples", "Fix: give every rank the whole data set"]),
    ("shuffled", ["ranks disagree about the training set", "rows sampled",
                  "Fix: give every rank the whole data set"]),
    ("out_dir", ["ranks disagree about the output folder", "rank 1: out_dir='out' on rank 1",
                 "Fix: give out_dir on rank 0 only"]),
])
def test_fit_on_ranks_misused_fails_clearly_on_every_rank(tmp_path, mode, says):
    """Ranks that hold other data would train on a mix of it, or (fewer batches on one)
    stop in MPI's message-size error; every rank writing out_dir repeats the records.
    Each is one error before the first step, not a hang and not a silent run."""
    exe = mpiexec()
    res = run([exe, "-n", "2", sys.executable, str(MISUSE), mode], tmp_path, timeout=60)
    out = res.stderr + res.stdout
    assert res.returncode != 0, out
    for text in says:
        assert text in out, out
    assert "trained" not in res.stdout and "truncated" not in out
    assert not (tmp_path / "out").exists()


def test_ranks_on_one_machine_share_its_cores_blas_threads(tmp_path):
    """One BLAS thread per core on every rank oversubscribes the machine (two ranks on two
    cores trained 5-15x slower than one process); a thread count the user set is kept."""
    exe = mpiexec()
    share = max(1, (os.cpu_count() or 1) // 2)
    res = run([exe, "-n", "2", sys.executable, str(MISUSE), "threads"], tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"[{share}]") == 2, res.stdout  # the ranks' lines may interleave
    cores = os.cpu_count() or 1
    if cores == share:
        return  # one core: the user's count could not be told from the share
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")}
    res = subprocess.run([exe, "-n", "2", sys.executable, str(MISUSE), "threads"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
                         env=dict(env, OPENBLAS_NUM_THREADS=str(cores),
                                  PYTHONPATH=str(Path(__file__).parents[1])))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"[{cores}]") == 2, res.stdout


def test_cli_resume_whose_batch_does_not_split_says_how_many_ranks(tmp_path):
    """A resumed run keeps its checkpoint's batch size: the fix is the rank count."""
    exe = mpiexec()
    args = [sys.executable, "-m", "fuseflow", "train", "--dataset", "digits", "--hidden", "16",
            "--no-progress"]
    assert run([*args, "--epochs", "1", "--batch-size", "63", "--out", "r"],
               tmp_path).returncode == 0
    res = run([exe, "-n", "2", *args[:4], "--resume", "r/last.safetensors", "--epochs", "2",
               "--no-progress"], tmp_path, timeout=60)
    assert res.returncode != 0
    assert ("the checkpoint's run trains on batches of 63, which cannot be split evenly over "
            "2 ranks") in res.stderr and "Fix: mpiexec -n 1" in res.stderr, res.stderr
    res = run([exe, "-n", "2", *args, "--batch-size", "1", "--out", "n"], tmp_path, timeout=60)
    assert "Fix: a batch size divisible by 2, e.g. --batch-size 2." in res.stderr, res.stderr


def test_each_rank_draws_its_own_random_numbers_in_fit():
    """Dropout-style layers get the step's key folded with the rank: one mask repeated on
    every rank's shard would not be the independent masks of a global batch."""

    class Noise(ff.nn.Layer):
        draws_random = True

        def __init__(self):
            self.keys = []

        def init(self, key, in_shape):
            return in_shape, {}

        def forward(self, params, x, *, key=None, train=True):
            if train:
                self.keys.append(tuple(int(k) for k in key))
            return x, {}

        def backward(self, params, residuals, dy):
            return {}, dy

    class OneRankOfTwo:  # the communicator as rank ``rank`` of 2 sees it (no MPI needed)
        size = 2

        def __init__(self, rank):
            self.rank, self.is_main = rank, rank == 0

        def shard(self, x, y):
            k = len(x) // 2
            return x[self.rank * k:(self.rank + 1) * k], y[self.rank * k:(self.rank + 1) * k]

        def allreduce_mean(self, tree):
            return tree

        def check_model(self, params):
            pass

        def check_same(self, what, description, fix=None):
            pass

        def check_data(self, what, x, y):
            pass

        def broadcast(self, tree):
            return tree

    x, y = ff.data.digits("train")
    keys = []
    for rank in (0, 1):
        noise = Noise()
        model = ff.nn.Serial(ff.nn.Dense(16, "relu"), noise, ff.nn.Dense(10))
        opt = ff.optim.sgd(0.1)
        state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
        ff.train.fit(model, opt, state, (x[:256], y[:256]), None, epochs=1, batch_size=64,
                     comm=OneRankOfTwo(rank), progress=False, log=None)
        keys.append(noise.keys)
        assert len(set(noise.keys)) == 4  # a new key every step
    assert not set(keys[0]) & set(keys[1])  # and another one on every rank
