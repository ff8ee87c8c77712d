"""DLPack interop on the CPU with a real producer: JAX arrays in, fuseflow results out.

A user brings params or batches from JAX (or PyTorch): ``ff.asarray`` takes them without a
copy (JAX's CPU buffers arrive read-only, so nothing of fuseflow may write into its inputs),
a compiled step trains on them like on NumPy arrays, and ``jnp.from_dlpack`` takes the
results back. The GPU side (CuPy and torch/JAX GPU tensors) is in test_gpu_backend.py.
"""

import numpy as np
import pytest

import fuseflow as ff

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def test_jax_arrays_in_without_a_copy_and_results_back(rng):
    w = jnp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    a = ff.asarray(w)
    assert type(a) is np.ndarray and a.dtype == np.float32
    assert a.ctypes.data == w.unsafe_buffer_pointer()  # the same memory, no copy
    np.testing.assert_array_equal(a, np.asarray(w))
    back = jnp.from_dlpack(a * 2)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(w) * 2)


def test_a_compiled_step_trains_on_read_only_jax_buffers(rng):
    """Params, batch and labels from JAX: the step must not write into them (they are
    JAX's), and it gives what the same step gives on NumPy copies, bit for bit."""
    model = ff.nn.Serial(ff.nn.Dense(16, "relu"), ff.nn.Dense(4))
    _, params = model.init(ff.random.key(int(rng.integers(1 << 30))), (8,))
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    opt = ff.optim.adam(1e-2)
    loss_and_grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def step(p, s, x, y):
        loss, g = loss_and_grads(p, x, y)
        p, s = ff.optim.update_and_apply(opt, g, s, p)
        return p, s, loss

    def train(p, x, y):
        compiled, s = ff.compile(step), opt.init(p)
        losses = []
        for _ in range(5):
            p, s, loss = compiled(p, s, x, y)
            losses.append(float(loss))
        return p, losses

    from_jax = ff.tree.map(lambda a: ff.asarray(jnp.asarray(a)), params)
    assert not any(leaf.flags.writeable for leaf in ff.tree.leaves(from_jax))
    frozen = ff.tree.map(np.copy, from_jax)
    got, got_losses = train(from_jax, ff.asarray(jnp.asarray(x)), ff.asarray(jnp.asarray(y)))
    want, want_losses = train(params, x, y)
    assert got_losses == want_losses and got_losses[-1] < got_losses[0]
    for a, b in zip(ff.tree.leaves(got), ff.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(ff.tree.leaves(from_jax), ff.tree.leaves(frozen)):
        np.testing.assert_array_equal(a, b)  # JAX's buffers are as they were
    out = [jnp.from_dlpack(leaf) for leaf in ff.tree.leaves(got)]
    assert all(isinstance(o, jax.Array) for o in out)
