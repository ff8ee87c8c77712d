"""fuseflow: functional training on fused cuBLASLt epilogs, with a NumPy reference.

    import fuseflow as ff
    model = ff.nn.Serial(ff.nn.Dense(256, "relu"), ff.nn.Dense(10))
    _, params = model.init(ff.random.key(0), (784,))
    loss, grads = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(params, x, y)
"""

from fuseflow import (backend, checkpoint, data, distributed, losses, mixed_precision, nn, optim,
                      random, train, tree)
from fuseflow.backend import asarray, device_put
from fuseflow._compile import CompiledStep, CompileError, compile
from fuseflow._dtypes import bfloat16
from fuseflow.grad import GradientCheckError, check_grads, value_and_grad

__version__ = "0.1.0"

__all__ = ["backend", "checkpoint", "data", "distributed", "losses", "mixed_precision", "nn",
           "optim", "random", "train", "tree", "asarray", "device_put",
           "bfloat16", "compile", "CompiledStep", "CompileError", "value_and_grad", "check_grads",
           "GradientCheckError", "__version__"]
