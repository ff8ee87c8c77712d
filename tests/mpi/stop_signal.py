"""Run under ``mpiexec -n 2`` with OUT_DIR WHEN: data-parallel fit on digits, where one rank
gets SIGTERM in the second epoch: rank 1 after a step (WHEN=step), or rank 0 while it writes
the epoch's checkpoint (WHEN=save). Every rank must stop after that same epoch (a rank
stopping alone would leave the other waiting in the next allreduce); each prints how."""

import os
import signal
import sys

import fuseflow as ff
from fuseflow.train import _fit

comm = ff.distributed.init()
train, test = ff.data.digits("train"), ff.data.digits("test")
model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(10))
opt = ff.optim.sgd(0.05)
state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
steps = ff.data.num_batches(len(train[0]), 64, drop_last=True)


def on_step(st, metrics):
    if sys.argv[2] == "step" and comm.rank == 1 and st.step == steps + 3:
        os.kill(os.getpid(), signal.SIGTERM)


saves = []


def save_state(path, st, metadata):
    save(path, st, metadata)
    saves.append(path)
    if sys.argv[2] == "save" and len(saves) == 3:  # epoch 2's ckpt, before its last.safetensors
        os.kill(os.getpid(), signal.SIGTERM)


save, _fit.save_state = _fit.save_state, save_state


try:
    ff.train.fit(model, opt, state, train, test, epochs=50, batch_size=64, comm=comm,
                 out_dir=sys.argv[1] if comm.is_main else None, on_step=on_step,
                 progress=False, log=None)
    print(f"rank {comm.rank} finished", flush=True)
except ff.train.Interrupted as e:
    print(f"rank {comm.rank} stopped after epoch {e.epoch if comm.is_main else '-'} by "
          f"{signal.Signals(e.signum).name}", flush=True)
