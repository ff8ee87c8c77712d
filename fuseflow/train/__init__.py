"""Training: a pure step, evaluation, and the ``fit`` loop behind ``fuseflow train``.

    state = ff.train.init_state(model, opt, (784,), ff.random.key(0))
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt)
    params, opt_state, metrics = step(state.params, state.opt_state, x, y)
    result = ff.train.fit(model, opt, state, (x, y), (x_test, y_test), epochs=5,
                          batch_size=128, out_dir="runs/demo")

Everything a run is lives in ``TrainState``; ``fit`` saves it per epoch, and a run resumed
from that file continues bit for bit (see ``_state``).
"""

from fuseflow.train._checkpoints import LAST, epoch_checkpoint, load_state, save_state
from fuseflow.train._datasets import Dataset, load_dataset, load_split
from fuseflow.train._evaluate import EvalResult, evaluate
from fuseflow.train._fit import Diverged, FitResult, Interrupted, fit
from fuseflow.train._recipe import Recipe, RecipeError, mlp
from fuseflow.train._records import CURVES_FILE, FIELDS, METRICS_FILE, read_metrics
from fuseflow.train._state import TrainState, init_state
from fuseflow.train._step import batch_casts, make_step

__all__ = ["TrainState", "init_state", "make_step", "batch_casts", "evaluate", "EvalResult", "fit",
           "FitResult", "Interrupted", "Diverged", "save_state", "load_state", "epoch_checkpoint",
           "LAST", "Recipe", "RecipeError", "mlp", "Dataset", "load_dataset", "load_split",
           "read_metrics", "FIELDS", "METRICS_FILE", "CURVES_FILE"]
