"""MNIST with the training loop behind ``fuseflow train``: fit, evaluate, checkpoints.

Uses real MNIST when it is on disk (``--data-dir DIR``, or ``$FUSEFLOW_DATA/mnist``, or
the cache); this script never downloads. Without ``--data-dir`` and no MNIST found, it
trains on scikit-learn's digits and says so; a ``--data-dir`` without MNIST is an error
(never a silent switch to other data). Resume or evaluate a run it wrote from Python:
``ff.train.load_state(path, like=state)`` (see docs/getting-started.md).

    python examples/03_mnist.py --data-dir ../shared/data/mnist --epochs 5 --out runs/ex03
"""

import argparse

import fuseflow as ff

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--out", default=None, help="write checkpoints, metrics.jsonl, curves.png")
args = parser.parse_args()

try:
    train = ff.data.mnist("train", args.data_dir, download=False)
    test = ff.data.mnist("test", args.data_dir, download=False)
    print("data: MNIST")
except ff.data.DatasetNotFoundError as err:
    if args.data_dir is not None:  # the folder the user named is the only place to look
        raise SystemExit(f"error: {err}") from None
    train, test = ff.data.digits("train"), ff.data.digits("test")
    print("data: MNIST not found in $FUSEFLOW_DATA or the cache (pass --data-dir DIR); "
          "using scikit-learn's digits")

batch_size = 128
steps_per_epoch = ff.data.num_batches(len(train[0]), batch_size, drop_last=True)
model = ff.train.mlp(hidden=(512, 512), classes=10)
optimizer = ff.optim.adam(ff.optim.cosine_decay_schedule(1e-3, args.epochs * steps_per_epoch))
state = ff.train.init_state(model, optimizer, (train[0].shape[1],), ff.random.key(0))

result = ff.train.fit(model, optimizer, state, train, test, epochs=args.epochs,
                      batch_size=batch_size, out_dir=args.out)
print(f"test_accuracy={result.test.accuracy:.4f}")
