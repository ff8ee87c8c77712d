"""A Recipe: the few choices that define a CLI training run, stored in every checkpoint.

The model and optimizer are rebuilt from it (``model()``, ``optimizer(steps_per_epoch)``),
which is what lets ``fuseflow eval CKPT`` and ``fuseflow train --resume CKPT`` work from
the file alone. It is plain JSON in the checkpoint's metadata, readable by any tool.
"""

from __future__ import annotations

import dataclasses
import math

from fuseflow import mixed_precision, nn, optim, tree
from fuseflow.nn._layer import shape_tuple
from fuseflow.backend.epilogs import ACTIVATIONS

__all__ = ["Recipe", "RecipeError", "mlp", "OPTIMIZERS", "ACTIVATIONS", "SCHEDULES",
           "PRECISIONS", "LOSS_SCALINGS", "DEFAULT_LR"]

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("cosine", "constant")
PRECISIONS = ("float32", "float16", "bfloat16")
#: 16-bit runs: dynamic loss scaling (skips non-finite steps), or none (bfloat16 only:
#: mixed_precision.compute_copy, every step applied, as PyTorch's autocast and JAX run it)
LOSS_SCALINGS = ("dynamic", "none")
#: peak learning rates measured on MNIST with the default MLP, 5 epochs, cosine decay:
#: adam 0.9839, adamw 0.9838, sgd 0.9819, momentum 0.9846 test accuracy
DEFAULT_LR = {"sgd": 0.5, "momentum": 0.1, "adam": 1e-3, "adamw": 1e-3}
MOMENTUM = 0.9


class RecipeError(ValueError):
    """A recipe (from the command line or a checkpoint) that cannot build a run."""


def mlp(hidden, classes: int, activation: str = "relu") -> nn.Serial:
    """``Serial(Dense(h, activation) for h in hidden, Dense(classes))``: the CLI's model.

    Each hidden Dense runs its activation in the matmul epilog; Serial fuses the
    activation's derivative into the next layer's input-gradient matmul. ``hidden`` is a
    sequence of widths, or one int for a single hidden layer.
    """
    hidden = shape_tuple(hidden) or hidden  # one int: one hidden layer
    return nn.Serial(*[nn.Dense(int(h), activation) for h in hidden], nn.Dense(int(classes)))


@dataclasses.dataclass(frozen=True)
class Recipe:
    dataset: str                 # "mnist", "digits" or "idx" (IDX files in data_dir)
    data_dir: str | None         # absolute folder of the IDX files, None for the defaults
    input_width: int             # features per example (784 for MNIST, 64 for digits)
    classes: int
    hidden: tuple = (512, 512)
    activation: str = "relu"
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0    # adamw only (decoupled; biases are not decayed)
    schedule: str = "cosine"     # cosine decay of lr to 0 over all epochs, or constant
    epochs: int = 5
    batch_size: int = 128
    seed: int = 0
    eval_batch_size: int = 1000
    precision: str = "float32"   # float16/bfloat16: mixed precision (float32 master weights)
    #: "dynamic" or "none" (bfloat16 only); checkpoints written before it was recorded
    #: trained with dynamic loss scaling, the default
    loss_scaling: str = "dynamic"
    #: training examples per epoch (None in checkpoints written before it was recorded):
    #: with the batch size it fixes the steps per epoch, hence the lr schedule's horizon
    train_examples: int | None = None

    def __post_init__(self):
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("loss_scaling", self.loss_scaling, LOSS_SCALINGS)
        if self.loss_scaling == "none" and self.precision == "float16":
            raise RecipeError(
                "float16 needs loss scaling: its small gradients flush to zero without it. "
                "Fix: --precision bfloat16 (float32's range) with --loss-scaling none, or "
                "drop --loss-scaling none.")
        if self.loss_scaling == "none" and self.precision == "float32":
            raise RecipeError(
                "--loss-scaling none is for 16-bit runs: float32 scales no loss anyway. Fix: "
                "add --precision bfloat16, or drop --loss-scaling none.")
        for name in ("input_width", "classes", "epochs", "batch_size", "eval_batch_size",
                     "train_examples"):
            value = getattr(self, name)
            if value is None and name == "train_examples":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"{name} must be a positive int, got {value!r}")
        if not self.hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1
                                  for h in self.hidden):
            raise RecipeError(f"hidden must be one or more positive layer widths, got "
                              f"{self.hidden!r}. Fix: --hidden 512,512")
        if not _finite_number(self.lr) or not self.lr > 0:
            raise RecipeError(f"lr must be a finite number > 0, got {self.lr!r}. Fix: --lr 1e-3")
        if not _finite_number(self.weight_decay) or self.weight_decay < 0:
            raise RecipeError(f"weight_decay must be a finite number >= 0, got "
                              f"{self.weight_decay!r}. Fix: --weight-decay 1e-4 (adamw), or 0")
        if self.weight_decay and self.optimizer != "adamw":
            raise RecipeError(
                f"--weight-decay {self.weight_decay} applies to --optimizer adamw (decoupled "
                f"weight decay), not {self.optimizer}. Fix: --optimizer adamw, or drop "
                "--weight-decay.")

    @property
    def in_shape(self) -> tuple:
        return (self.input_width,)

    def model(self) -> nn.Serial:
        return mlp(self.hidden, self.classes, self.activation)

    @property
    def compute_dtype(self):
        """For ``make_step``/``fit``: None in float32, else the 16-bit compute dtype."""
        return None if self.precision == "float32" else self.precision

    def optimizer_for(self, steps_per_epoch: int):
        """The optimizer; a cosine schedule decays lr to 0 over ``epochs * steps_per_epoch``.
        In float16 and bfloat16 it is wrapped in dynamic loss scaling, or with loss scaling
        "none" (bfloat16) in ``compute_copy``, which keeps the params' bfloat16 copy."""
        lr = self.lr
        if self.schedule == "cosine":
            lr = optim.cosine_decay_schedule(self.lr, self.epochs * steps_per_epoch)
        if self.optimizer == "sgd":
            opt = optim.sgd(lr)
        elif self.optimizer == "momentum":
            opt = optim.sgd(lr, momentum=MOMENTUM)
        elif self.optimizer == "adam":
            opt = optim.adam(lr)
        else:
            opt = optim.adamw(lr, weight_decay=self.weight_decay, mask=_weights_only)
        if self.precision == "float32":
            return opt
        if self.loss_scaling == "none":
            return mixed_precision.compute_copy(opt, self.precision)
        return mixed_precision.dynamic_loss_scaling(opt)

    def to_metadata(self) -> dict:
        return dict(dataclasses.asdict(self), hidden=list(self.hidden))

    @classmethod
    def from_metadata(cls, meta: dict, where: str = "checkpoint") -> Recipe:
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(meta, dict) or not {"dataset", "input_width", "classes"} <= set(meta):
            raise RecipeError(
                f"{where} holds no fuseflow training recipe (hidden sizes, dataset, ...) in "
                "its metadata: it was not written by `fuseflow train`. Fix: load it from "
                "Python with the model and optimizer it was trained with, state = "
                "ff.train.load_state(path, like=ff.train.init_state(model, opt, in_shape, "
                "key)), then ff.train.evaluate(model, state.params, x, y) or resume with "
                "ff.train.fit(model, opt, state, ...); a bare params file: "
                "ff.checkpoint.load(path).")
        unknown = set(meta) - fields
        if unknown:
            raise RecipeError(f"{where}: unknown recipe fields {sorted(unknown)}; it was "
                              "written by a newer fuseflow. Fix: upgrade fuseflow.")
        return cls(**dict(meta, hidden=tuple(meta.get("hidden", cls.hidden))))


def _weights_only(params):
    """Weight decay mask: matrices decay, biases (1-D) do not."""
    return tree.map(lambda p: p.ndim > 1, params)


def _finite_number(value) -> bool:
    """An int or float (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _choice(name, value, choices):
    if value not in choices:
        raise RecipeError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
