"""Run under ``mpiexec -n 2`` with OUT_DIR: data-parallel ``fit`` on small synthetic
problems (``CASES``); rank 0 writes each case's final params, history, the ranks' agreement
and what its progress bar counted to OUT_DIR/NAME.pkl, for tests/test_distributed_audit.py
to compare with references computed in one process."""

import pickle
import sys
from pathlib import Path

import numpy as np

import fuseflow as ff

N_IN, N_OUT = 12, 5


def data(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, N_IN)).astype(np.float32)
    return x, rng.integers(0, N_OUT, n)


def mlp(dropout=False):
    return ff.nn.Serial(ff.nn.Dense(16, "relu"), *([ff.nn.Dropout(0.5)] if dropout else []),
                        ff.nn.Dense(N_OUT))


def adam16():  # a first loss scale that overflows float16 grads: skipped steps too
    return ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-2), init_scale=2.0 ** 19,
                                                   compute_dtype="float16")


# name: (model, optimizer, examples, batch size, fit keyword arguments)
CASES = {
    "sgd": (mlp, lambda: ff.optim.sgd(0.1), 96, 24, {}),
    "adam_ragged": (mlp, lambda: ff.optim.adam(1e-2), 100, 24, {"drop_last": False}),
    "dropout": (lambda: mlp(True), lambda: ff.optim.adam(1e-2), 96, 24, {}),
    "float16": (mlp, adam16, 96, 24, {"compute_dtype": "float16"}),
    "ragged_odd": (mlp, lambda: ff.optim.sgd(0.1), 99, 24, {"drop_last": False}),
}
EPOCHS = 2


def start(name, key=0):
    model_fn, opt_fn, n, bs, kwargs = CASES[name]
    model, opt = model_fn(), opt_fn()
    return model, opt, ff.train.init_state(model, opt, (N_IN,), ff.random.key(key)), n, bs, kwargs


class Bar:  # stands in for tqdm: what the progress bar was told
    def __init__(self, total=None, disable=None, **_):
        self.total, self.n, self.disable = total, 0, True

    def update(self, n):
        self.n += n

    def close(self):
        BARS.append((self.total, self.n))


BARS = []


def main(out):
    from fuseflow.train import _fit

    _fit.tqdm = Bar
    comm = ff.distributed.init()
    for name in CASES:
        model, opt, state, n, bs, kwargs = start(name)
        steps = []
        BARS.clear()
        try:
            res = ff.train.fit(model, opt, state, data(n), None, epochs=EPOCHS, batch_size=bs,
                               comm=comm, progress=False, log=None,
                               on_step=lambda st, m, steps=steps: steps.append(st.step),
                               **kwargs)
            record = {"params": ff.tree.leaves(res.state.params), "history": res.history,
                      "scale": float(getattr(res.state.opt_state, "scale", 0))}
        except (ff.distributed.DistributedError, ValueError) as e:  # on every rank: no hang
            record = {"error": str(e), "steps": len(steps)}
        if "params" in record:  # every rank ends with the same params
            mine = b"".join(np.ascontiguousarray(p).tobytes() for p in record["params"])
            record["ranks_agree"] = len(set(comm._mpi.allgather(mine))) == 1
        record["bars"] = list(BARS)
        if comm.is_main:
            (out / f"{name}.pkl").write_bytes(pickle.dumps(record))
    # the ranks start from different keys: fit takes rank 0's params, and must take the
    # rest of its state too (data order, Dropout key), or the shards are not one batch
    model, opt, state, n, bs, kwargs = start("sgd", comm.rank)
    res = ff.train.fit(model, opt, state, data(n), None, epochs=EPOCHS, batch_size=bs,
                       comm=comm, progress=False, log=None)
    if comm.is_main:
        (out / "rank_keys.pkl").write_bytes(pickle.dumps(ff.tree.leaves(res.state.params)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
