"""BatchNorm means the same thing on both backends (docs/parity.md §9).

* The fp64 reference pair of a CNN with batchnorm after a convolution (2d) and after a dense layer
  (1d) agrees to the REFERENCE bounds, sync and unsync, world 1-3, mirrored and multi_worker, with
  an uneven last batch (1,001 samples, batch 128: the last step holds 105) and, for sync, a last
  step that leaves two of three replicas empty. The running statistics are in the compared weights,
  so the pair agreeing also says the TF backend keeps replica 0's running statistics as DDP does.
* ``sync: true`` is the statistics of the global batch: the same spec on 3 ranks and on 1 gives the
  same fp64 trajectory, on each backend. ``sync: false`` at 3 ranks is a different model (each
  replica normalises its own third), and the same comparison tells them apart.
* fp32 ``dualtrain compare`` PASSes for a CNN with dropout + batchnorm.
"""

import pytest

from dualtrain.core.weights import load_weights
from dualtrain.parity import compare_records
from dualtrain.parity.checks import Reference, check_reference_loss, check_reference_weights
from dualtrain.records.record import read_run

from .test_reference import assert_reference

DATA = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "optimizer.name=sgd",
    "optimizer.lr=0.05",
    "optimizer.momentum=0.9",
)


def bn_cnn(sync: bool, dense_bn: bool = True, dropout: bool = False) -> str:
    bn = f"{{type: batchnorm, sync: {str(sync).lower()}}}"
    drop = "{type: dropout, rate: 0.25}, " if dropout else ""
    dense = f"{bn}, " if dense_bn else ""
    return (
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, " + bn + ", {type: relu}, "
        "{type: maxpool2d, pool_size: 2}, "
        + drop
        + "{type: flatten}, {type: dense, units: 32}, "
        + dense
        + "{type: relu}, {type: dense, units: 10}]"
    )


CASES = {
    "unsync-w1": (bn_cnn(False), "distribution.world_size=1"),
    "unsync-w2-mirrored": (bn_cnn(False), "distribution.world_size=2"),
    "unsync-w3-multi_worker": (
        bn_cnn(False),
        "distribution.world_size=3",
        "tf.strategy=multi_worker",
    ),
    "sync-w2-multi_worker": (bn_cnn(True), "distribution.world_size=2", "tf.strategy=multi_worker"),
    # 1,025 samples: the last global batch holds one sample, replicas 1 and 2 are empty (and add
    # nothing to the statistics); the dense batchnorm is left out (one value per channel).
    "sync-w3-empty-replicas": (
        bn_cnn(True, dense_bn=False),
        "distribution.world_size=3",
        "data.train_limit=1025",
    ),
}


SLOW = pytest.mark.slow
# Default suite: one unsync and one sync case per strategy kind, the empty replicas; the slow set
# (CI runs it) the rest of the matrix.
CASE_PARAMS = [
    pytest.param("unsync-w1", marks=SLOW),
    "unsync-w2-mirrored",
    pytest.param("unsync-w3-multi_worker", marks=SLOW),
    pytest.param("sync-w2-multi_worker", marks=SLOW),
    "sync-w3-empty-replicas",
]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_reference_pair_agrees(runs, case):
    ref = runs.reference("model.preset=null", *DATA, *CASES[case])
    assert_reference(ref)
    losses = [r["loss"] for r in ref.a.train]
    assert losses[-1] < losses[0], losses
    # The running statistics moved away from their start (0 and 1) and are in the weights files.
    w = load_weights(ref.a.path / "weights_final.npz")
    assert abs(w["1.running_mean"]).max() > 1e-3 and abs(w["1.running_var"] - 1).max() > 1e-3


def _one_vs_three(runs, backend: str, sync: bool) -> list:
    over = ("model.preset=null", *DATA, bn_cnn(sync), "precision.dtype=fp64")
    one = read_run(runs(backend, *over, "distribution.world_size=1"))
    three = read_run(runs(backend, *over, "distribution.world_size=3"))
    return [
        check_reference_loss(Reference(one, three)),
        check_reference_weights(Reference(one, three)),
    ]


@pytest.mark.parametrize(
    "backend", [pytest.param("torch", marks=SLOW), pytest.param("tf", marks=SLOW)]
)
def test_sync_statistics_are_the_global_batch(runs, backend):
    for check in _one_vs_three(runs, backend, sync=True):
        assert check.passed, check.detail


@SLOW
def test_unsync_statistics_are_per_replica(runs):
    # The control for the test above: per-replica statistics at 3 ranks are not world 1's.
    assert not any(c.passed for c in _one_vs_three(runs, "torch", sync=False))


@pytest.mark.slow
def test_fp32_compare_passes_for_cnn_with_dropout_and_batchnorm(runs):
    over = ("model.preset=null", *DATA, bn_cnn(False, dropout=True), "distribution.world_size=2")
    a, b = read_run(runs("torch", *over)), read_run(runs("tf", *over))
    cmp = compare_records(a, b, runs.reference(*over))
    assert cmp.passed, cmp.diagnosis.summary()
