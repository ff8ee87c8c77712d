"""A model as functions: a Serial of Dense layers, a loss, Adam, and a training step you
can read in full.

Nothing here is hidden in an object: the parameters, the optimizer state and the step are
plain values and functions, and the loop is ten lines. Trains on scikit-learn's
handwritten digits (ships with scikit-learn, no download) in a few seconds.

    python examples/01_mlp_functions.py
"""

import fuseflow as ff
from fuseflow import nn

# The model: two hidden layers whose ReLU runs inside the matmul (RELU_AUX_BIAS); Serial
# fuses each ReLU's derivative into the next layer's backward matmul (DRELU_BGRAD).
model = nn.Serial(nn.Dense(128, "relu"), nn.Dense(128, "relu"), nn.Dense(10))
_, params = model.init(ff.random.key(0), (64,))
print(f"{model}: {ff.tree.size(params)} parameters")

optimizer = ff.optim.adam(1e-3)
opt_state = optimizer.init(params)
loss_and_grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)


def step(params, opt_state, x, y):
    """One step of gradient descent, as a pure function: new values in, new values out."""
    loss, grads = loss_and_grads(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return ff.optim.apply_updates(params, updates), opt_state, loss


x, y = ff.data.digits("train")
x_test, y_test = ff.data.digits("test")
data_key = ff.random.key(1)
for epoch in range(10):
    for xb, yb in ff.data.batches(x, y, 64, key=ff.random.fold_in(data_key, epoch)):
        params, opt_state, loss = step(params, opt_state, xb, yb)
    print(f"epoch {epoch + 1}: loss {float(loss):.4f}")

accuracy = ff.losses.accuracy(model.apply(params, x_test), y_test)
print(f"test accuracy {float(accuracy):.4f}")
