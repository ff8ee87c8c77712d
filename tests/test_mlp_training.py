"""End to end on the NumPy backend: a 784-256-256-10 ReLU MLP trained with adam learns a
synthetic but non-trivial task (labels from a random teacher network)."""

import numpy as np

import fuseflow as ff
from fuseflow import nn


def teacher_data(n, seed=0):
    """Inputs on a 16-dimensional subspace of R^784; labels from a fixed random ReLU teacher."""
    teacher = np.random.default_rng(1234)  # one fixed teacher; seed only picks the inputs
    embed = teacher.standard_normal((16, 784)) / 4
    w1, w2 = teacher.standard_normal((16, 64)), teacher.standard_normal((64, 10))
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 16))
    x = (z @ embed + 0.1 * rng.standard_normal((n, 784))).astype(np.float32)
    return x, (np.maximum(z @ w1, 0) @ w2).argmax(1).astype(np.int64)


def test_784_256_256_10_adam_learns_teacher_task():
    x, y = teacher_data(8192)
    x_test, y_test = teacher_data(1024, seed=1)
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(256, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (784,))
    opt = ff.optim.adam(1e-3)
    opt_state = opt.init(params)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    losses = []
    key = ff.random.key(1)
    for epoch in range(8):
        perm = ff.random.permutation(ff.random.fold_in(key, epoch), len(x))
        for i in range(0, len(x), 128):
            idx = perm[i:i + 128]
            loss, grads = grad_fn(params, x[idx], y[idx])
            updates, opt_state = opt.update(grads, opt_state, params)
            params = ff.optim.apply_updates(params, updates)
            losses.append(float(loss))
    first, last = losses[0], np.mean(losses[-64:])
    test_acc = float(ff.losses.accuracy(model.apply(params, x_test), y_test))
    print(f"loss {first:.3f} -> {last:.4f}, test accuracy {test_acc:.3f}")
    assert first > 1.8          # near chance level, ln(10) = 2.30
    assert last < 0.25          # the stated loss (mean of the last 64 steps); chance 2.30
    assert test_acc > 0.80      # and it generalises (chance: 0.10)
    assert all(p.dtype == np.float32 for p in ff.tree.leaves(params))
