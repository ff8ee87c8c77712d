"""Run under ``mpiexec -n 2`` with MODE OUT_DIR: situations where one rank leaves the others
behind. Each must end the job (an error on every rank, or MPI_Abort), never hang.

- ``state``: the ranks' TrainStates agree on the model but not on the epoch (rank 0 holds
  a resumed state, rank 1 a fresh one): rank 1 has more epochs to train than rank 0.
- ``cli_before_fit``: ``fuseflow train`` where rank 1 gets SIGTERM while it loads the data.
- ``cli_second_signal``: ``fuseflow train`` where rank 1 gets SIGTERM twice in its first
  epoch ("a second one stops at once").
"""

import os
import signal
import sys
from pathlib import Path

import numpy as np

import fuseflow as ff
from fuseflow import cli

mode, out = sys.argv[1], Path(sys.argv[2])
comm = ff.distributed.init()


def sigterm():
    os.kill(os.getpid(), signal.SIGTERM)


if mode == "state":
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 3, 32)
    model, opt = ff.nn.Serial(ff.nn.Dense(8, "relu"), ff.nn.Dense(3)), ff.optim.sgd(0.1)
    state = ff.train.init_state(model, opt, (4,), ff.random.key(0))
    if comm.rank == 0:
        state = state._replace(epoch=1, step=4)
    ff.train.fit(model, opt, state, (x, y), None, epochs=2, batch_size=8, comm=comm,
                 progress=False, log=None)
    print(f"rank {comm.rank} finished", flush=True)
    sys.exit(0)

if comm.rank == 1 and mode == "cli_before_fit":
    load = cli.load_dataset

    def load_dataset(*args, **kwargs):
        sigterm()  # sigterm_as_interrupt raises StopSignal here
        return load(*args, **kwargs)

    cli.load_dataset = load_dataset
if comm.rank == 1 and mode == "cli_second_signal":
    fit = cli.fit

    def fit_twice_stopped(*args, **kwargs):
        def on_step(state, metrics):
            if state.step == 3:
                sigterm()
                sigterm()
        return fit(*args, on_step=on_step, **kwargs)

    cli.fit = fit_twice_stopped
sys.exit(cli.main(["train", "--dataset", "digits", "--epochs", "2", "--batch-size", "64",
                   "--hidden", "32", "--no-progress", "--out", str(out / "run")]))
