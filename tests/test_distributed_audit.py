"""Audit of data-parallel training on CPU (MPI): ``fit`` over 2 ranks against references
computed here in one process, the collectives on unusual trees, ``fuseflow train`` resumed
under mpiexec with another number of ranks, and the ways one rank can leave the others
waiting. The helper scripts are tests/mpi/audit_*.py."""

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fuseflow as ff
from tests.mpi import audit_fit
from tests.test_distributed import mpiexec, run

MPI_DIR = Path(__file__).parent / "mpi"


@pytest.fixture(scope="module")
def fit_results(tmp_path_factory):
    """audit_fit.py's results on 2 ranks, by case name."""
    exe = mpiexec()
    out = tmp_path_factory.mktemp("audit_fit")
    res = run([exe, "-n", "2", sys.executable, str(MPI_DIR / "audit_fit.py"), str(out)], out)
    assert res.returncode == 0, res.stderr
    return {p.stem: pickle.loads(p.read_bytes()) for p in out.glob("*.pkl")}


def single_process_fit(name, key=0):
    model, opt, state, n, bs, kwargs = audit_fit.start(name, key)
    return ff.train.fit(model, opt, state, audit_fit.data(n), None, epochs=audit_fit.EPOCHS,
                        batch_size=bs, progress=False, log=None, **kwargs)


def data_parallel_reference(name, ranks=2):
    """The documented recipe, by hand in one process: each global batch in the order of
    ``fold_in(data_key, epoch)``, split in ``ranks`` equal shares, each share's gradient
    with the layers' key ``fold_in(fold_in(key, step), rank)``, their mean applied once."""
    model, opt, state, n, bs, kwargs = audit_fit.start(name)
    x, y = audit_fit.data(n)
    params, opt_state, step = state.params, state.opt_state, 0
    loss = ff.losses.softmax_cross_entropy
    if kwargs.get("compute_dtype"):
        grad_fn = ff.mixed_precision.value_and_grad(model, loss, kwargs["compute_dtype"])
    else:
        grad_fn = ff.value_and_grad(model, loss)
    for epoch in range(audit_fit.EPOCHS):
        for xb, yb in ff.data.batches(x, y, bs, key=ff.random.fold_in(state.data_key, epoch),
                                      drop_last=kwargs.get("drop_last", True)):
            k, shares = len(xb) // ranks, []
            for r in range(ranks):
                key = ff.random.fold_in(ff.random.fold_in(state.key, step), r)
                extra = {}
                if kwargs.get("compute_dtype"):
                    extra = {"loss_scale": opt_state.scale,
                             "compute_params": opt_state.compute_params}
                shares.append(grad_fn(params, xb[r * k:(r + 1) * k], yb[r * k:(r + 1) * k],
                                      key=key, **extra)[1])
            with np.errstate(invalid="ignore", over="ignore"):  # overflowed float16 shares
                grads = ff.tree.map(lambda *g: sum(g) / ranks, *shares)
            params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)
            step += 1
    return ff.tree.leaves(params)


@pytest.mark.parametrize("name", ["sgd", "adam_ragged"])
def test_two_ranks_fit_like_one_process(fit_results, name):
    """Params and the epoch metrics (train_loss, train_acc averaged over every rank's share),
    also with drop_last=False and a smaller last batch that splits (100 = 4*24 + 4)."""
    got, want = fit_results[name], single_process_fit(name)
    assert got["ranks_agree"]
    for a, b in zip(got["params"], ff.tree.leaves(want.state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [r["step"] for r in got["history"]] == [r["step"] for r in want.history]
    for a, b in zip(got["history"], want.history):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        assert a["train_acc"] == b["train_acc"]


@pytest.mark.parametrize("name", ["dropout", "float16"])
def test_two_ranks_fit_like_the_data_parallel_recipe(fit_results, name):
    """Dropout (each rank's share its own key) and float16 mixed precision on NumPy (float32
    grads averaged, then one loss-scaled update on every rank; the first loss scale, 2^19,
    overflows: those steps are skipped on every rank together)."""
    got = fit_results[name]
    assert got["ranks_agree"]
    if name == "float16":
        assert got["scale"] < 2.0 ** 19
    for a, b in zip(got["params"], data_parallel_reference(name)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_last_batch_that_cannot_split_is_refused_before_training(fit_results):
    got = fit_results["ragged_odd"]  # 99 = 4*24 + 3 examples, 2 ranks
    assert got.get("steps") == 0 and "cannot be split over 2 ranks" in got["error"], got


def test_fit_takes_rank_0s_whole_state(fit_results):
    want = single_process_fit("sgd", key=0)
    for a, b in zip(fit_results["rank_keys"], ff.tree.leaves(want.state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_progress_bar_counts_the_whole_epoch(fit_results):
    bars = fit_results["sgd"]["bars"]  # one bar an epoch: none would pass all() vacuously
    assert len(bars) == audit_fit.EPOCHS and all(total == n for total, n in bars), bars


def test_collectives_on_unusual_trees(tmp_path):
    exe = mpiexec()
    res = run([exe, "-n", "2", sys.executable, str(MPI_DIR / "audit_collectives.py"),
               str(tmp_path)], tmp_path, timeout=60)
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in (0, 1)]
    for got in ranks:
        m = got["mixed"]
        assert m["w"].dtype == np.float32 and np.all(m["w"] == 1.5)
        assert m["c"].dtype == np.complex128 and m["c"][0] == 1 + 1j  # not its real part
        assert m["i"].dtype == np.float64 and list(m["i"]) == [0.5, 3]
        assert m["b"].dtype == np.float64 and list(m["b"]) == [0.5]
        assert type(m["s"]) is float and m["s"] == 0.5 and type(m["n"]) is float
        assert m["z"].shape == () and m["z"].dtype == np.float32 and m["z"] == 0.5
        assert m["e"].shape == (0, 3) and m["none"] is None and m["nested"]["empty"] == {}
        # float16 is summed in float32: 40000 + 40008 overflows float16, their mean not
        assert got["float16"]["h"].dtype == np.float16 and np.isfinite(got["float16"]["h"]).all()
        h, i8 = got["float16_and_int"]
        assert h.dtype == np.float16 and np.all(h == 60000) and i8.dtype == np.float64
        assert got["empty"] == {"a": {}, "b": []} and got["python_only"] == [0.75, 0.5]
        # bfloat16 (kind "V", which MPI takes no buffer of): averaged in float32, broadcast
        # as its bytes
        for name, want in (("bfloat16", 1.5), ("broadcast_bfloat16", 2.5)):
            h = got[name]["h"]
            assert h.dtype == ff.bfloat16 and np.all(h.astype(np.float32) == want), got[name]
        b = got["broadcast"]  # rank 1's tree, leaf types and dtypes kept
        np.testing.assert_array_equal(b["p"], np.arange(6, dtype=np.float32).reshape(2, 3).T + 1)
        assert b["p"].dtype == np.float32 and b["z"].dtype == np.int32 and b["z"] == 1
        assert (b["n"], b["f"], b["t"]) == (6, 1.5, True)
        assert (type(b["n"]), type(b["f"]), type(b["t"])) == (int, float, bool)
        assert b["e"] == {} and b["none"] is None and got["broadcast_empty"] == {}
        kind, message = got["broadcast_roots_differ"]  # not a hang, not a silent no-op
        assert kind == "DistributedError" and "rank 1: root 1" in message
        kind, message = got["broadcast_no_such_root"]
        assert kind == "DistributedError" and "root must be a rank, 0..1, got 2" in message
        assert got["check_empty"] is None and got["check_python_number"] is None
        kind, message = got["check_dtype"]
        assert kind == "DistributedError" and "rank 1: a (2,) float32" in message
    np.testing.assert_array_equal(ranks[0]["source_after"],  # never written by Bcast
                                  np.arange(6, dtype=np.float32).reshape(2, 3).T)
    # a whole TrainState broadcast keeps its int counters: fit writes metrics.jsonl
    assert res.returncode == 0 and "state broadcast: trained 4 steps" in res.stdout, res.stderr


def test_complex_leaves_reach_nccl_as_real_numbers(monkeypatch):
    """The GPU engine hands the packed buffer to NCCL, which sums float16/32/64 only
    (backend/_nccl.py); a complex buffer went in as it was: a KeyError in its dtype table.
    Emulated on the host: the same branch, a stand-in that refuses what NCCL would."""
    from fuseflow import backend, distributed

    sums = []

    def nccl_sum(size, rank, mpi_comm=None):
        def total(flat):  # two ranks holding the same values
            assert flat.dtype in (np.float16, np.float32, np.float64), flat.dtype
            sums.append(flat.dtype)
            flat *= 2
        return total

    monkeypatch.setattr(backend, "nccl_sum", nccl_sum)
    monkeypatch.setattr(distributed, "is_cupy", lambda a: True)
    comm = distributed.Communicator(None, always_reduce=True)
    comm.size = 2
    got = comm.allreduce_mean({"w": np.full(2, 1.5, np.float32), "c": np.array([1 + 2j])})
    assert sums == [np.float64]
    assert got["w"].dtype == np.float32 and np.all(got["w"] == 1.5)
    assert got["c"].dtype == np.complex128 and got["c"][0] == 1 + 2j


def test_shard_names_drop_last_for_a_last_batch_that_cannot_split():
    comm = ff.distributed.Communicator(None)
    comm.size = 2  # as test_distributed does: shard's arithmetic alone
    x = np.arange(6)
    assert [list(a) for a in comm.shard(x, x)] == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ff.distributed.DistributedError,
                       match=r"^shard: a global batch of 3 .*drop_last=True"):
        comm.shard(np.ones(3))
    comm.size = 1
    with pytest.raises(ff.distributed.DistributedError, match="root must be a rank, 0..0"):
        comm.broadcast({"a": np.ones(1)}, root=1)


def test_cli_resumes_under_mpiexec_with_the_same_or_another_number_of_ranks(tmp_path):
    """A 2-rank run's epoch-1 checkpoint resumed on 2 ranks (in its folder) and on 1 (in
    another) trains the same epoch 2; rank 0 alone reports and writes each epoch once."""
    exe = mpiexec()
    args = [sys.executable, "-m", "fuseflow", "train", "--dataset", "digits", "--batch-size",
            "64", "--hidden", "64", "--schedule", "constant", "--no-progress"]
    ckpt = "two/ckpt-epoch1.safetensors"
    for cmd in ([exe, "-n", "2", *args, "--epochs", "1", "--out", "two"],
                [exe, "-n", "2", *args, "--epochs", "2", "--resume", ckpt],
                args + ["--epochs", "2", "--resume", ckpt, "--out", "one"]):
        res = run(cmd, tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout.count("test_accuracy=") == 1 and "Traceback" not in res.stderr
    records = {}
    for folder in ("two", "one"):
        lines = (tmp_path / folder / "metrics.jsonl").read_text().splitlines()
        records[folder] = [json.loads(s) for s in lines]
        assert [r["epoch"] for r in records[folder]] == [1, 2]  # each epoch written once
    a, b = records["two"][1], records["one"][1]
    assert a["step"] == b["step"] == 2 * (1438 // 64) and a["test_acc"] == b["test_acc"]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    for x, y in zip(ff.tree.leaves(ff.checkpoint.load(tmp_path / "two" / "last.safetensors")),
                    ff.tree.leaves(ff.checkpoint.load(tmp_path / "one" / "last.safetensors"))):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def run_or_hang(cmd, cwd, timeout=8, stderr=subprocess.DEVNULL):
    """``cmd``'s exit code, or None if it is still running after ``timeout`` seconds (the
    launcher is then asked to end its ranks, SIGTERM; failing that they are killed, as one
    process group)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=stderr, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None


@pytest.mark.parametrize("mode", [
    "state",
    "cli_before_fit",
    "cli_second_signal",
])
def test_one_rank_never_leaves_the_others_waiting(tmp_path, mode):
    exe = mpiexec()
    with open(tmp_path / "stderr.txt", "wb") as err:
        code = run_or_hang([exe, "-n", "2", sys.executable, str(MPI_DIR / "audit_hang.py"),
                            mode, str(tmp_path)], tmp_path, stderr=err)
    assert code is not None, "the job hung"
    if mode != "state":  # the abort's line names the signal: a stop is not an error
        said = (tmp_path / "stderr.txt").read_text(errors="replace")
        assert "rank 1 was stopped" in said and "SIGTERM" in said, said
        assert "stopped with an error" not in said, said
