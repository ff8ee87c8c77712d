"""The one table of cuBLASLt epilogs that fuseflow uses, and the relu_aux format.

Every backend implements the same epilogs with the same meaning. All matmuls are written in
the dense layer's orientation (activations row-major ``(batch, features)``, weights
``(out, in)``); the cuBLASLt view of each is given in the backend docstrings.

Aux formats, both in the (features, batch) orientation, column-major, exactly as cuBLASLt
writes them:

- ``relu_aux``: uint8, shape ``(round_up(ceil(F/8), 16), batch)``. Bit i (least significant
  first) of byte j in column n is feature ``8*j + i`` of sample n; it is set where the
  pre-activation is ``>= 0`` (cuBLASLt's rule; PyTorch and JAX use ``> 0``, so at exactly
  zero fuseflow passes the gradient through). Bits of rows ``>= F`` are padding: never read.
- ``gelu_aux``: the pre-activation itself, shape ``(F, batch)``, the dtype of the output.
"""

from __future__ import annotations

from typing import NamedTuple


class Epilog(NamedTuple):
    name: str                  # the cuBLASLt / nvmath name, e.g. "RELU_AUX_BIAS"
    stage: str                 # "forward", "dgrad" (input gradient) or "wgrad" (weight gradient)
    activation: str | None  # None, "relu" or "gelu"
    bias: bool                 # forward: adds a bias; dgrad/wgrad: also returns a bias gradient
    aux: bool                  # forward: writes aux; dgrad: reads aux


def _e(name, stage, activation=None, bias=False, aux=False):
    return name, Epilog(name, stage, activation, bias, aux)


EPILOGS = dict([
    _e("DEFAULT", "forward"),
    _e("BIAS", "forward", bias=True),
    _e("RELU", "forward", "relu"),
    _e("RELU_BIAS", "forward", "relu", bias=True),
    _e("RELU_AUX", "forward", "relu", aux=True),
    _e("RELU_AUX_BIAS", "forward", "relu", bias=True, aux=True),
    _e("GELU", "forward", "gelu"),
    _e("GELU_BIAS", "forward", "gelu", bias=True),
    _e("GELU_AUX", "forward", "gelu", aux=True),
    _e("GELU_AUX_BIAS", "forward", "gelu", bias=True, aux=True),
])
DGRAD_EPILOGS = dict([
    _e("DEFAULT", "dgrad"),
    _e("DRELU", "dgrad", "relu", aux=True),
    _e("DRELU_BGRAD", "dgrad", "relu", bias=True, aux=True),
    _e("DGELU", "dgrad", "gelu", aux=True),
    _e("DGELU_BGRAD", "dgrad", "gelu", bias=True, aux=True),
])
WGRAD_EPILOGS = dict([
    _e("DEFAULT", "wgrad"),
    _e("BGRADB", "wgrad", bias=True),
])
AUX_KEYS = {"relu": "relu_aux", "gelu": "gelu_aux"}
ACTIVATIONS = tuple(AUX_KEYS)  # the activations an epilog fuses: "relu", "gelu"


def forward_epilog(activation, *, bias: bool, aux: bool) -> str:
    """The forward epilog name for an activation (None, "relu", "gelu")."""
    if activation is None:
        return "BIAS" if bias else "DEFAULT"
    name = activation.upper() + ("_AUX" if aux else "") + ("_BIAS" if bias else "")
    return EPILOGS[name].name


def dgrad_epilog(activation, *, bgrad: bool) -> str:
    """The input-gradient epilog that applies ``activation``'s derivative (and bias grad)."""
    if activation is None:
        return "DEFAULT"
    return DGRAD_EPILOGS["D" + activation.upper() + ("_BGRAD" if bgrad else "")].name


def relu_aux_rows(features: int) -> int:
    """Bytes per column of relu_aux: ceil(features / 8) rounded up to a multiple of 16."""
    nbytes = -(-features // 8)
    return -(-nbytes // 16) * 16


def aux_shape(activation: str, features: int, batch: int) -> tuple:
    if activation == "relu":
        return (relu_aux_rows(features), batch)
    return (features, batch)


def lookup(table: dict, name: str, what: str) -> Epilog:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} epilog {name!r}; expected one of "
                         f"{sorted(table)}") from None
