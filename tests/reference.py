"""Independent, deliberately naive references the engine is tested against.

Nothing here uses fuseflow: plain float64 NumPy formulas written from the definitions.
"""

import numpy as np

C = np.sqrt(2 / np.pi)


def relu_mask(pre):
    return pre >= 0  # cuBLASLt's rule (PyTorch/JAX use > 0)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(C * (x + 0.044715 * x**3)))


def gelu_grad(x):
    t = np.tanh(C * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * C * (1 + 3 * 0.044715 * x**2)


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
