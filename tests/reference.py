"""Independent, deliberately naive references the engine is tested against, and the
helpers that check it: central finite differences in float64 and float64 comparisons.

Nothing here uses fuseflow: plain float64 NumPy formulas written from the definitions
(``layer_fd_check`` only calls the ``forward``/``backward`` of the layer it is given).
"""

import numpy as np

C = np.sqrt(2 / np.pi)


def relu_mask(pre):
    return pre >= 0  # cuBLASLt's rule (PyTorch/JAX use > 0)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(C * (x + 0.044715 * x**3)))


def gelu_grad(x):
    """d/dx gelu; its limits 1 (x -> +inf) and 0 (x -> -inf) where tanh has saturated."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.tanh(C * (x + 0.044715 * x**3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * C * (1 + 3 * 0.044715 * x**2)
    return np.where(np.abs(t) == 1, 0.5 * (1 + t), d)


ACT = {None: (lambda x: x, lambda x: np.ones_like(x)),
       "relu": (lambda x: np.where(relu_mask(x), x, 0.0), lambda x: relu_mask(x).astype(float)),
       "gelu": (gelu, gelu_grad)}


def mlp(params, x, activations):
    """Forward and backward of an MLP from the textbook formulas; returns (y, grad_fn)."""
    pres, hs = [], [x]
    for p, act in zip(params, activations):
        pre = hs[-1] @ p["w"].T + p.get("b", 0)
        pres.append(pre)
        hs.append(ACT[act][0](pre))

    def grad(dy):
        grads = [None] * len(params)
        for i in range(len(params) - 1, -1, -1):
            dpre = dy * ACT[activations[i]][1](pres[i])
            g = {"w": dpre.T @ hs[i]}
            if "b" in params[i]:
                g["b"] = dpre.sum(0)
            grads[i] = g
            dy = dpre @ params[i]["w"]
        return grads, dy
    return hs[-1], grad


def relu_aux_bits(aux, features, batch):
    """Decode relu_aux bit by bit (byte j, bit i -> feature 8j+i) into a (batch, F) bool."""
    out = np.zeros((batch, features), bool)
    for n in range(batch):
        for f in range(features):
            out[n, f] = (int(aux[f // 8, n]) >> (f % 8)) & 1
    return out


def fill_padding_with_garbage(aux, features, rng):
    """Set every padding bit (features >= F) of a relu_aux copy to random values."""
    aux = np.array(aux, order="F", copy=True)
    full, rem = divmod(features, 8)
    if rem:
        keep = (1 << rem) - 1
        aux[full] = (aux[full] & keep) | (rng.integers(0, 256, aux.shape[1]) & ~keep & 0xFF)
        full += 1
    aux[full:] = rng.integers(0, 256, aux[full:].shape)
    return aux


LABEL_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def layernorm(x, scale, bias, eps):
    """Forward, and a grad(dy) -> ({"scale", "bias"}, dx) through the explicit per-row
    Jacobian of the normalisation (not the usual closed form)."""
    n, f = x.shape
    mu = x.mean(1, keepdims=True)
    var = ((x - mu) ** 2).mean(1, keepdims=True)
    xhat = (x - mu) / np.sqrt(var + eps)
    s = np.ones(f) if scale is None else scale
    y = xhat * s + (0 if bias is None else bias)

    def grad(dy):
        dx = np.empty_like(x)
        for i in range(n):
            r = 1 / np.sqrt(var[i, 0] + eps)
            c = x[i] - mu[i, 0]
            # d xhat_j / d x_k = r (delta_jk - 1/f) - r^3 c_j c_k / f
            jac = r * (np.eye(f) - 1.0 / f) - r**3 * np.outer(c, c) / f
            dx[i] = jac.T @ (dy[i] * s)
        return {"scale": (dy * xhat).sum(0), "bias": dy.sum(0)}, dx
    return y, grad


def softmax_xent(z, labels):
    """Mean softmax cross-entropy of logits z (computed in float64) and its gradient."""
    z = z.astype(np.float64)
    rows, labels = np.arange(len(z)), labels.astype(np.int64)
    m = z.max(1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(1)) + m[:, 0]
    p = np.exp(z - lse[:, None])
    p[rows, labels] -= 1
    return (lse - z[rows, labels]).mean(), p / len(z)


# ---- checking helpers: central finite differences in float64 and comparisons ------------
def fd(f, x, eps=1e-6):
    """Central differences of the scalar f(x) at every element of the float64 array x.

    x is perturbed in place, one element at a time, and restored exactly, so f may also
    read x through a structure holding it (see fd_params)."""
    assert x.dtype == np.float64, f"finite differences need float64, got {x.dtype}"
    g = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f(x)
        x[idx] = old - eps
        down = f(x)
        x[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g


def fd_params(f, params, eps=1e-6):
    """fd of the scalar f(params) for every array in a tree of dicts, lists and tuples;
    returns a tree of the same structure."""
    def walk(node):
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(v) for v in node)
        return fd(lambda _: f(params), node, eps)
    return walk(params)


def same_bits_or_both_nan(got, want):
    """Bit for bit, except that a NaN may carry another payload: conversions disagree on
    it (CUDA's float to bfloat16 gives 0x7FFF where ml_dtypes keeps the quiet NaN 0x7FC0;
    CuPy's -ftz float32 to float64 another NaN than NumPy's exact widening)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


def close(got, want, rtol, atol, what="", seed=None):
    """assert_allclose in float64; the message names what is compared and the test seed."""
    msg = what + (f" (seed {seed})" if seed is not None else "")
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=rtol, atol=atol, err_msg=msg)


def tree_close(got, want, rtol, atol, what="", seed=None):
    """close() leaf by leaf over two trees that must have the same structure."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{what}: {got} vs {want}"
        for k in want:
            tree_close(got[k], want[k], rtol, atol, f"{what}[{k!r}]", seed)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{what}: {got} vs {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            tree_close(g, w, rtol, atol, f"{what}[{i}]", seed)
    else:
        close(got, want, rtol, atol, what, seed)


def rel_err(got, ref):
    """Norm-relative error of ``got`` against ``ref`` in float64 (a GPU result against its
    float64 reference); the shapes must match and ``got`` be finite."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all(), "non-finite values in the GPU result"
    den = np.linalg.norm(ref)
    return np.linalg.norm(got - ref) / (den if den > 0 else 1.0)


def away_from_zero(rng, shape, margin=0.05):
    """Normals with |v| >= margin: finite differences never straddle the ReLU kink."""
    v = rng.standard_normal(shape)
    return np.where(np.abs(v) < margin, np.copysign(margin, v) + v, v)


def layer_fd_check(layer, params, x, rng, key=None, rtol=1e-5, atol=1e-7):
    """A layer's backward in float64 against central differences of sum(forward * dy), for
    the input and every parameter, with a random dy; returns (y, residuals, dy, grads, dx)."""
    y, res = layer.forward(params, x, key=key)
    dy = rng.standard_normal(y.shape)
    grads, dx = layer.backward(params, res, dy)
    obj_x = lambda xx: float((layer.forward(params, xx, key=key)[0] * dy).sum())
    close(dx, fd(obj_x, x), rtol, atol, "dx", rng.seed)
    obj_p = lambda p: float((layer.forward(p, x, key=key)[0] * dy).sum())
    tree_close(grads, fd_params(obj_p, params), rtol, atol, "param grads", rng.seed)
    return y, res, dy, grads, dx
