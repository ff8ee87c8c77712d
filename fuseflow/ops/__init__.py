"""Primitive forward/backward pairs that layers are built from."""

from fuseflow.ops.dense import dense_backward, dense_forward

__all__ = ["dense_backward", "dense_forward"]
