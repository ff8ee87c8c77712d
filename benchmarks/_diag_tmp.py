import json, numpy as np, cupy as cp, fuseflow as ff
from fuseflow.backend import _cuda_fused as F
model = ff.nn.Serial(ff.nn.Dense(512, "relu"), ff.nn.Dense(512, "relu"), ff.nn.Dense(10))
_, params = model.init(ff.random.key(0), (784,))
params = ff.device_put(params, "cuda")
x = cp.random.random((128, 784), dtype=cp.float32); y = cp.random.randint(0, 10, 128).astype(cp.int64)
for unscaled in (False, True):
    f = ff.mixed_precision.value_and_grad(model, ff.losses.softmax_cross_entropy, unscaled=unscaled)
    loss, g = f(params, x, y, loss_scale=cp.asarray(1024, dtype=cp.float32))
    for path, a in zip(ff.tree.paths(g), ff.tree.leaves(g)):
        print(unscaled, path, a.shape, a.dtype, a.data.ptr % 16, a.flags.c_contiguous, a.strides)
leaves = ff.tree.leaves(params)
low = [ (a * 1024).astype(cp.float16) for a in leaves]
print("aligned fresh", F._aligned(low))
