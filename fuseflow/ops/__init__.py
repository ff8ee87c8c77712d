"""Primitive forward/backward pairs that layers are built from."""

from fuseflow.ops.dense import dense_backward, dense_forward, dense_softmax_xent

__all__ = ["dense_backward", "dense_forward", "dense_softmax_xent"]
