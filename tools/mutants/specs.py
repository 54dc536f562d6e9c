"""The specs the semantic mutants are measured on (parity_tests/test_mutants.py)."""

from __future__ import annotations

# 1,001 samples in global batches of 128 over 2 replicas: 7 full steps (64/64), then 105 samples
# split 53/52 (a partial, uneven batch), 2 epochs; lr follows a cosine schedule; clipping at 0.5 is
# active.
DATA = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "distribution.world_size=2",
    "precision.dtype=fp64",
)
TABLE = (
    "data.train_limit=null",
    "data.test_limit=null",
    "data.batch_size=32",
    "train.epochs=3",
    "distribution.world_size=2",
    "precision.dtype=fp64",
    "optimizer.name=adam",
    "model.preset=null",
    "model.layers=[{type: dense, units: 16}, {type: relu}, {type: dense, units: 1}]",
)
SPECS = {
    "sgd": (
        *DATA,
        "optimizer.lr=0.1",
        "optimizer.momentum=0.9",
        "optimizer.schedule.name=cosine",
        "optimizer.clip_grad_norm=0.5",
    ),
    "adam": (*DATA, "optimizer.name=adam", "optimizer.lr=0.001"),
    "adamw": (*DATA, "optimizer.name=adamw", "optimizer.lr=0.001", "optimizer.weight_decay=0.01"),
    "rmsprop": (*DATA, "optimizer.name=rmsprop", "optimizer.lr=0.001"),
    "stride2": (
        *DATA,
        "optimizer.lr=0.05",
        "optimizer.momentum=0.9",
        "model.preset=null",
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3, "
        "stride: 2, padding: 1}, {type: relu}, {type: flatten}, {type: dense, units: 10}]",
    ),
    # the other losses and the validation split, on scikit-learn's bundled tables (all rows)
    "mse": (
        *TABLE,
        "data.dataset=diabetes",
        "model.inputs=[{name: x, shape: [10]}]",
        "model.loss=mse",
        "optimizer.lr=0.01",
    ),
    "bce": (
        *TABLE,
        "data.dataset=breast_cancer",
        "model.inputs=[{name: x, shape: [30]}]",
        "model.loss=binary_cross_entropy",
        "optimizer.lr=0.001",
    ),
    "val": (
        *TABLE,
        "data.dataset=wine",
        "model.inputs=[{name: x, shape: [13]}]",
        "data.validation=0.2",
        "optimizer.lr=0.001",
        "model.layers=[{type: dense, units: 16}, {type: relu}, {type: dense, units: 3}]",
    ),
    "bn": (
        *DATA,
        "optimizer.lr=0.05",
        "optimizer.momentum=0.9",
        "model.preset=null",
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, {type: batchnorm}, "
        "{type: relu}, {type: maxpool2d, pool_size: 2}, {type: flatten}, {type: dense, units: 32}, "
        "{type: batchnorm}, {type: relu}, {type: dense, units: 10}]",
    ),
}
# the MNIST MLP with dropout after its hidden layer (the dropout porting mistakes)
SPECS["dropout"] = (
    *DATA,
    "optimizer.lr=0.05",
    "model.preset=null",
    "model.layers=[{type: flatten}, {type: dense, units: 32}, {type: relu}, "
    "{type: dropout, rate: 0.3}, {type: dense, units: 10}]",
)
# the MNIST MLP with gelu (erf form) after its hidden layer (the simulated upgrades)
SPECS["gelu"] = (
    *DATA,
    "optimizer.lr=0.05",
    "model.preset=null",
    "model.layers=[{type: flatten}, {type: dense, units: 32}, {type: gelu}, "
    "{type: dense, units: 10}]",
)
# The bn spec with the TF run as two worker processes (MultiWorkerMirroredStrategy): each worker
# evaluates its ranges on the host with its own copy of the variables, so a replica whose running
# statistics drifted from replica 0's shows in the evaluation. In one mirrored process evaluation
# reads the primary copy (replica 0's) for every range, and per-replica statistics never reach an
# output (tf.strategy is cosmetic: the torch run is the bn spec's).
SPECS["bn_mw"] = (*SPECS["bn"], "tf.strategy=multi_worker")
