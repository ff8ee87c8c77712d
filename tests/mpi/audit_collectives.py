"""Run under ``mpiexec -n 2`` with OUT_DIR: ``allreduce_mean``, ``broadcast`` and
``check_model`` on unusual trees; each rank pickles what it got to OUT_DIR/rank{R}.pkl (an
exception as its type and message). Last, a whole TrainState broadcast from rank 0 trains
in ``fit`` with an output folder: rank 0 prints "state broadcast: trained" (an exception
there ends the job)."""

import pickle
import sys
from pathlib import Path

import numpy as np

import fuseflow as ff

comm = ff.distributed.init()
r = comm.rank
out = Path(sys.argv[1])
got = {}


def attempt(name, fn):
    try:
        got[name] = fn()
    except Exception as e:  # noqa: BLE001 - the test reads which, and what it said
        got[name] = (type(e).__name__, str(e))


mixed = {"w": np.full((2, 3), r + 1, np.float32), "c": np.array([1 + 2j * r]),
         "i": np.array([r, 3]), "b": np.array([r == 0]), "s": float(r), "n": r,
         "z": np.array(r, np.float32), "e": np.zeros((0, 3), np.float32), "none": None,
         "nested": {"empty": {}, "t": (np.float64(r),)}}
attempt("mixed", lambda: comm.allreduce_mean(mixed))
attempt("float16", lambda: comm.allreduce_mean({"h": np.full(3, 40000 + 8 * r, np.float16)}))
attempt("float16_and_int", lambda: comm.allreduce_mean([np.full(2, 60000, np.float16),
                                                         np.int8(r)]))
attempt("bfloat16", lambda: comm.allreduce_mean({"h": np.full(3, 1 + r, ff.bfloat16)}))
attempt("empty", lambda: comm.allreduce_mean({"a": {}, "b": []}))
attempt("python_only", lambda: comm.allreduce_mean([1.5 * r, r]))

source = {"p": np.arange(6, dtype=np.float32).reshape(2, 3).T + r, "n": r + 5,
          "f": r + 0.5, "t": r == 1, "z": np.array(r, np.int32), "e": {}, "none": None}
attempt("broadcast", lambda: comm.broadcast(source, root=1))
got["source_after"] = source["p"].copy()  # the caller's array is not written
attempt("broadcast_bfloat16",  # a mixed-precision state's bfloat16 compute copy
        lambda: comm.broadcast({"h": np.full(3, 1.5 + r, ff.bfloat16)}, root=1))
attempt("broadcast_empty", lambda: comm.broadcast({}))
attempt("broadcast_roots_differ", lambda: comm.broadcast({"a": np.ones(2)}, root=r))
attempt("broadcast_no_such_root", lambda: comm.broadcast({"a": np.ones(2)}, root=2))
attempt("check_empty", lambda: comm.check_model({}))
attempt("check_python_number", lambda: comm.check_model({"a": 1.0 if r else np.float64(2)}))
attempt("check_dtype", lambda: comm.check_model({"a": np.ones(2, np.float32 if r else
                                                             np.float64)}))
(out / f"rank{r}.pkl").write_bytes(pickle.dumps(got))

# rank 0's whole state everywhere (the ranks drew their own): step, epoch, batch_in_epoch
# must stay ints, or the first epoch's metrics line cannot be written
model = ff.nn.Serial(ff.nn.Dense(8, "relu"), ff.nn.Dense(3))
opt = ff.optim.sgd(0.1)
state = comm.broadcast(ff.train.init_state(model, opt, (4,), ff.random.key(r)))
rng = np.random.default_rng(0)
x, y = rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 3, 32)
res = ff.train.fit(model, opt, state, (x, y), None, epochs=1, batch_size=8, comm=comm,
                   out_dir=out / "run" if comm.is_main else None, progress=False, log=None)
if comm.is_main:
    print(f"state broadcast: trained {res.state.step} steps", flush=True)
