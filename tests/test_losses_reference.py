"""Losses on fresh random inputs (``rng``), against central finite differences in float64
(``ref.fd``) and independent float64 NumPy references written from the definitions
(``ref.softmax_xent``; mean squared error and binary cross-entropy inline): every integer
label dtype, batch 1 and one class, float32/float16 logits, non-contiguous logits and
labels, grad_scale/grad_dtype, soft binary targets.
"""

import numpy as np
import pytest

from fuseflow import losses
from tests import reference as ref


@pytest.mark.parametrize("label_dtype", ref.LABEL_DTYPES)
@pytest.mark.parametrize("batch,classes", [(1, 1), (1, 3), (4, 17), (3, 33)])
def test_softmax_cross_entropy_label_dtypes_fd_and_reference(rng, label_dtype, batch, classes):
    z = rng.standard_normal((batch, classes)) * 3
    labels = rng.integers(0, classes, batch).astype(label_dtype)
    loss, g = losses.softmax_cross_entropy(z, labels)
    loss_ref, g_ref = ref.softmax_xent(z, labels)
    ref.close(loss, loss_ref, 1e-12, 1e-12, "loss", rng.seed)
    ref.close(g, g_ref, 1e-12, 1e-13, "grad", rng.seed)
    fd = ref.fd(lambda q: float(losses.softmax_cross_entropy(q, labels)[0]), z)
    ref.close(g, fd, 1e-5, 1e-7, "grad (fd)", rng.seed)
    acc = losses.accuracy(z, labels)
    assert acc == (z.argmax(1) == labels.astype(np.int64)).mean(), f"seed {rng.seed}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_softmax_cross_entropy_low_precision_and_non_contiguous(rng, dtype):
    z = (rng.standard_normal((9, 6)) * 3).astype(dtype).T  # (6, 9) non-contiguous
    labels = np.repeat(rng.integers(0, 9, 6), 2)[::2]        # strided labels
    loss, g = losses.softmax_cross_entropy(z, labels)
    assert g.dtype == dtype and g.shape == z.shape
    loss_ref, g_ref = ref.softmax_xent(z, labels)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    ref.close(loss, loss_ref, tol, tol, "loss", rng.seed)
    ref.close(g, g_ref, tol, tol, "grad", rng.seed)


def test_softmax_cross_entropy_grad_scale_and_dtype_vs_reference(rng):
    """A loss-scaled float16 gradient: the loss unscaled, the gradient times the scale."""
    z = rng.standard_normal((5, 4)).astype(np.float16)
    labels = rng.integers(0, 4, 5).astype(np.uint8)
    scale = np.float32(512.0)
    loss, g = losses.softmax_cross_entropy(z, labels, grad_scale=np.asarray(scale),
                                           grad_dtype=np.float16)
    loss_ref, g_ref = ref.softmax_xent(z, labels)
    assert g.dtype == np.float16
    ref.close(loss, loss_ref, 1e-5, 1e-5, "loss", rng.seed)
    ref.close(g, g_ref * scale, 2e-3, 2e-3, "grad", rng.seed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 1), (4, 3), (2, 17)])
def test_mse_fd_and_reference(rng, dtype, shape):
    o = rng.standard_normal(shape).astype(dtype)
    t = rng.standard_normal(shape).astype(dtype)
    loss, g = losses.mse(o, t)
    assert g.dtype == dtype
    d = o.astype(np.float64) - t
    ref.close(loss, (d * d).mean(), 1e-6, 1e-7, "loss", rng.seed)
    ref.close(g, 2 * d / d.size, 1e-6, 1e-8, "grad", rng.seed)
    if dtype == np.float64:
        fd = ref.fd(lambda q: float(losses.mse(q, t)[0]), o)
        ref.close(g, fd, 1e-6, 1e-9, "grad (fd)", rng.seed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sigmoid_bce_soft_targets_fd_and_reference(rng, dtype):
    x = (rng.standard_normal((4, 5)) * 4).astype(dtype)
    t = rng.random((4, 5)).astype(dtype)  # soft targets in [0, 1]
    loss, g = losses.sigmoid_binary_cross_entropy(x, t)
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    s = 1 / (1 + np.exp(-x64))
    loss_ref = -(t64 * np.log(s) + (1 - t64) * np.log1p(-s)).mean()
    ref.close(loss, loss_ref, 1e-6, 1e-7, "loss", rng.seed)
    ref.close(g, (s - t64) / x.size, 1e-6, 1e-8, "grad", rng.seed)
    if dtype == np.float64:
        fd = ref.fd(lambda q: float(losses.sigmoid_binary_cross_entropy(q, t)[0]), x)
        ref.close(g, fd, 1e-6, 1e-9, "grad (fd)", rng.seed)
