"""Run under ``mpiexec -n N`` (or alone): 20 data-parallel adam steps on fixed global
batches; rank 0 saves the final params to the path given as argv[1]. Alone with
``--emulate-ranks 2``: one process forms the two ranks' gradients on their halves one after
the other and averages them as ``allreduce_mean`` does (a float32 sum, then / 2), so the
result should be the 2-rank run's bit for bit (with more ranks MPI may add in another
order)."""

import sys

import numpy as np

import fuseflow as ff

comm = ff.distributed.init()
model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(16, "gelu"), ff.nn.Dense(10))
_, params = model.init(ff.random.key(comm.rank if "--bad-init" in sys.argv else 0), (20,))
if "--bad-broadcast" in sys.argv and comm.rank == 1:  # a different model before broadcast
    _, params = ff.nn.Serial(ff.nn.Dense(33, "relu"), ff.nn.Dense(10)).init(ff.random.key(0), (20,))
params = comm.broadcast(params)  # identical start everywhere, whatever each rank drew
if "--bad-model" in sys.argv and comm.rank == 1:
    _, params = ff.nn.Serial(ff.nn.Dense(33, "relu"), ff.nn.Dense(10)).init(ff.random.key(0), (20,))
comm.check_model(params)
opt = ff.optim.adam(1e-2)
state = opt.init(params)
grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
emulated_ranks = (int(sys.argv[sys.argv.index("--emulate-ranks") + 1])
                  if "--emulate-ranks" in sys.argv else 0)
rng = np.random.default_rng(0)
for step in range(20):
    x = rng.standard_normal((64, 20)).astype(np.float32)  # the same global batch on every rank
    y = rng.integers(0, 10, 64)
    if "--die" in sys.argv and comm.rank == 1 and step == 5:
        raise RuntimeError("simulated failure on rank 1")
    if emulated_ranks:
        assert len(x) % emulated_ranks == 0, "equal shares, as comm.shard requires"
        k = len(x) // emulated_ranks
        shares = [grad_fn(params, x[r * k:(r + 1) * k], y[r * k:(r + 1) * k])[1]
                  for r in range(emulated_ranks)]
        total = shares[0]
        for g in shares[1:]:  # rank order, as MPI's SUM over 2 ranks (commutative: same bits)
            total = ff.tree.map(np.add, total, g)
        grads = ff.tree.map(lambda t: t / np.float32(emulated_ranks), total)
    else:
        loss, grads = grad_fn(params, *comm.shard(x, y))
        grads = comm.allreduce_mean(grads)
    params, state = ff.optim.update_and_apply(opt, grads, state, params)
if comm.is_main:
    ff.checkpoint.save(sys.argv[1], params)
