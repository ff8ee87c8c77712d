"""Named optimizers, each one ``chain`` of building blocks (as optax's aliases)."""

from __future__ import annotations

from fuseflow.optim._base import (GradientTransformation, chain, check_flag, check_lr,
                                  check_number, identity)
from fuseflow.optim._fused import fused_spec
from fuseflow.optim._transforms import (
    add_decayed_weights,
    scale_by_adam,
    scale_by_learning_rate,
    trace,
)


def _adam_args(opt, b1, b2, eps):
    return {"b1": check_number(opt, "b1", b1, low=0.0, high=1.0, example=0.9),
            "b2": check_number(opt, "b2", b2, low=0.0, high=1.0, example=0.999),
            "eps": check_number(opt, "eps", eps, low=0.0, low_open=True, example=1e-8)}


def sgd(lr, momentum: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """Gradient descent, with (Nesterov) momentum if ``momentum > 0``."""
    lr = check_lr("sgd", lr)
    momentum = check_number("sgd", "momentum", momentum, low=0.0, high=1.0, example=0.9)
    nesterov = check_flag("sgd", "nesterov", nesterov)
    if nesterov and momentum == 0.0:
        raise ValueError("sgd: nesterov=True needs momentum > 0. "
                         "Fix: sgd(lr, momentum=0.9, nesterov=True)")
    # momentum 0 keeps no buffer at all (optax's sgd(momentum=None)).
    first = trace(momentum, nesterov) if momentum > 0 else identity()
    return fused_spec(chain(first, scale_by_learning_rate(lr)), lr=lr,
                      kind="momentum" if momentum > 0 else "sgd", momentum=momentum,
                      nesterov=nesterov)


def adam(lr, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Adam (Kingma & Ba, 2015)."""
    lr = check_lr("adam", lr)
    args = _adam_args("adam", b1, b2, eps)
    return fused_spec(chain(scale_by_adam(**args), scale_by_learning_rate(lr)),
                      kind="adam", lr=lr, **args)


def adamw(lr, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-4, mask=None) -> GradientTransformation:
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    ``mask``: None decays every leaf; else a pytree of bools like the params (True: decay
    this leaf), or a callable params -> such a pytree, e.g. to skip biases:
    ``mask=lambda params: ff.tree.map(lambda p: p.ndim > 1, params)``.
    """
    lr = check_lr("adamw", lr)
    wd = check_number("adamw", "weight_decay", weight_decay, low=0.0, example=1e-4)
    args = _adam_args("adamw", b1, b2, eps)
    return fused_spec(chain(scale_by_adam(**args), add_decayed_weights(wd, mask),
                            scale_by_learning_rate(lr)),
                      kind="adam", lr=lr, weight_decay=wd, mask=mask, **args)
