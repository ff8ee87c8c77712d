"""fit under mpiexec with a misuse named by argv[1]: "len" (rank 1 holds fewer examples),
"shuffled" (rank 1 holds them in another order), "out_dir" (every rank given out_dir), or
"threads" (no misuse: prints this rank's BLAS thread count and exits)."""

import sys

import fuseflow as ff

comm = ff.distributed.init()
mode = sys.argv[1]
if mode == "threads":
    from threadpoolctl import threadpool_info

    print("blas threads", [p["num_threads"] for p in threadpool_info()
                           if p["user_api"] == "blas"], flush=True)
    sys.exit(0)
x, y = ff.data.digits("train")
if mode == "len" and comm.rank == 1:
    x, y = x[:1000], y[:1000]
if mode == "shuffled" and comm.rank == 1:
    x, y = x[::-1].copy(), y[::-1].copy()
model = ff.train.mlp(hidden=(16,), classes=10)
opt = ff.optim.sgd(0.1)
state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
ff.train.fit(model, opt, state, (x, y), None, epochs=1, batch_size=64, comm=comm,
             out_dir="out" if mode == "out_dir" else None, progress=False, log=None)
print("rank", comm.rank, "trained", flush=True)
