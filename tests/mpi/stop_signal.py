"""Run under ``mpiexec -n 2``: data-parallel fit on digits, where only rank 1 gets SIGTERM,
in its second epoch. Every rank must stop after that same epoch (a rank stopping alone would
leave the other waiting in the next allreduce); each prints how it stopped."""

import os
import signal
import sys

import fuseflow as ff

comm = ff.distributed.init()
train, test = ff.data.digits("train"), ff.data.digits("test")
model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(10))
opt = ff.optim.sgd(0.05)
state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
steps = ff.data.num_batches(len(train[0]), 64, drop_last=True)


def on_step(st, metrics):
    if comm.rank == 1 and st.step == steps + 3:
        os.kill(os.getpid(), signal.SIGTERM)


try:
    ff.train.fit(model, opt, state, train, test, epochs=50, batch_size=64, comm=comm,
                 out_dir=sys.argv[1] if comm.is_main else None, on_step=on_step,
                 progress=False, log=None)
    print(f"rank {comm.rank} finished", flush=True)
except ff.train.Interrupted as e:
    print(f"rank {comm.rank} stopped after epoch {e.epoch if comm.is_main else '-'} by "
          f"{signal.Signals(e.signum).name}", flush=True)
