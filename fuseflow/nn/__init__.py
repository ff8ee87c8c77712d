"""Layers: explicit forward/backward pairs over parameter pytrees (contract in ``_layer``)."""

from fuseflow.nn import initializers
from fuseflow.nn._activation import GELU, ReLU
from fuseflow.nn._dense import Dense
from fuseflow.nn._dropout import Dropout
from fuseflow.nn._flatten import Flatten
from fuseflow.nn._layer import Layer, LayerError
from fuseflow.nn._layernorm import LayerNorm
from fuseflow.nn._serial import Serial

__all__ = [
           "GELU",
           "Dense",
           "Dropout",
           "Flatten",
           "Layer",
           "LayerError",
           "LayerNorm",
           "ReLU",
           "Serial",
           "initializers",
]
