"""examples/audit's scripts recorded and compared: the same script twice PASSes; each planted
difference is named (the slow ones run with -m slow)."""

from __future__ import annotations

import pytest

from dualtrain.audit.compare import compare_recorded
from tests.audit.scripts import record


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    return record("ddp_mnist.py", tmp_path_factory.mktemp("audit") / "torch")


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    return record("keras_mnist.py", tmp_path_factory.mktemp("audit") / "keras")


def names(a, b, tmp_path):
    cmp = compare_recorded(a, b)
    return cmp, [f.name for f in cmp.findings]


@pytest.mark.slow  # default-suite time: the recorder's default DDP test is ddp_case.py's
def test_the_ddp_script_recorded_twice_passes(torch_run, tmp_path):
    again = record("ddp_mnist.py", tmp_path / "again")
    cmp, found = names(torch_run, again, tmp_path)
    assert cmp.passed and found == [], cmp.verdict
    assert [c.status for c in cmp.checks] == ["PASS"] * 8
    rows = cmp.a.rows(1)
    assert [len(r.exact) for r in rows] == [64, 64]  # two replicas, 64 rows each
    assert (rows[0].indices or ())[:2] != (rows[1].indices or ())[:2]  # the DistributedSampler's


@pytest.mark.slow  # the Keras recorder's default test is test_keras_errors.py (one process)
def test_the_keras_script_recorded_twice_passes(keras_run, tmp_path):
    again = record("keras_mnist.py", tmp_path / "again")
    cmp, found = names(keras_run, again, tmp_path)
    assert cmp.passed and found == [], cmp.verdict
    assert [len(r.exact) for r in cmp.a.rows(1)] == [64, 64]
    assert len(cmp.a.steps) == 16 and all((s.grad_norm or 0) > 0 for s in cmp.a.steps)


TORCH_PLANTS = [
    (("--no-set-epoch",), "set_epoch forgotten (every epoch the same order)"),
    (("--scheduler-per-step",), "scheduler stepped per epoch vs per step"),
    (("--reduction", "sum"), "per-replica loss reduction (sum vs mean)"),
    (("--seed", "2"), "shuffle seeds"),
    (("--train-size", "1025"), "DistributedSampler padding"),
    (("--amp",), "loss scaling in one run only"),
    (("--batch-size", "32"), "different global batch size"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags,name", TORCH_PLANTS, ids=[n for _, n in TORCH_PLANTS])
def test_a_difference_planted_in_the_ddp_script_is_named(torch_run, tmp_path, flags, name):
    planted = record("ddp_mnist.py", tmp_path / "planted", *flags)
    cmp, found = names(torch_run, planted, tmp_path)
    assert not cmp.passed
    assert name in found, found
    finding = next(f for f in cmp.findings if f.name == name)
    assert finding.fixes and all("->" in line for line in finding.fixes)


@pytest.mark.slow
@pytest.mark.sweep  # CI's time (docs/testing.md)
def test_drop_remainder_planted_in_the_keras_script_is_named(keras_run, tmp_path):
    planted = record(
        "keras_mnist.py", tmp_path / "planted", "--drop-remainder", "--train-size", "1000"
    )
    full = record("keras_mnist.py", tmp_path / "full", "--train-size", "1000")
    cmp, found = names(full, planted, tmp_path)
    assert "drop_remainder" in found, found
    assert any("drop_remainder" in line for f in cmp.findings for line in f.fixes)


@pytest.mark.slow
def test_loss_scale_and_batchnorm_conventions_across_the_frameworks(tmp_path):
    t = record("ddp_mnist.py", tmp_path / "t", "--amp", "--batchnorm", "0.1")
    k = record("keras_mnist.py", tmp_path / "k", "--mixed", "--batchnorm", "0.99")
    cmp, found = names(t, k, tmp_path)
    assert "loss-scale defaults (LossScaleOptimizer 2**15 vs GradScaler 2**16)" in found, found
    assert "BatchNorm momentum convention" in found, found


@pytest.fixture(scope="module")
def corrected(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrected")
    t = record("corrected/ddp_mnist.py", d / "torch")
    k = record("corrected/keras_mnist.py", d / "keras", "--init-from", str(t / "weights_init.npz"))
    return t, k


@pytest.mark.slow
def test_the_scripts_as_written_differ_and_the_corrected_pair_passes(
    torch_run, keras_run, corrected, tmp_path
):
    cmp, found = names(torch_run, keras_run, tmp_path)
    assert {
        "different models",
        "different optimizers",
        "different base learning rate",
        "input normalisation",
        "shuffle seeds",
        "DistributedSampler interleaving vs tf.data auto-shard",
    } <= set(found), found
    # every section each recorder wrote is one the diagnoses read (dualtrain.audit.config)
    assert cmp.a.config.unread() == set() and cmp.b.config.unread() == set()
    cmp, found = names(*corrected, tmp_path / "c")
    assert cmp.passed and found == [], (cmp.verdict, [c.detail for c in cmp.checks])


CORRECTED_PLANTS = [
    ("torch", ("--interleave",), "DistributedSampler interleaving vs tf.data auto-shard"),
    ("torch", ("--sum-replicas",), "per-replica loss reduction (local mean vs global batch)"),
    ("keras", ("--epsilon", "1e-7"), "optimizer conventions (momentum, epsilon, weight decay)"),
    (
        "torch",
        ("--weight-decay", "1e-4"),
        "optimizer conventions (momentum, epsilon, weight decay)",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "side,flags,name", CORRECTED_PLANTS, ids=[f"{s}{f[0]}" for s, f, _ in CORRECTED_PLANTS]
)
def test_a_difference_planted_in_the_corrected_pair_is_named(
    corrected, tmp_path, side, flags, name
):
    t, k = corrected
    if side == "torch":
        t = record("corrected/ddp_mnist.py", tmp_path / "t", *flags)
    else:
        k = record(
            "corrected/keras_mnist.py",
            tmp_path / "k",
            "--init-from",
            str(t / "weights_init.npz"),
            *flags,
        )
    cmp, found = names(t, k, tmp_path)
    assert name in found, found
    assert not cmp.passed or name.startswith("optimizer conventions")


@pytest.mark.slow  # two TF worker processes (~25 s)
def test_the_keras_script_under_multi_worker_mirrored_records_what_mirrored_does(
    keras_run, tmp_path
):
    """Two localhost MultiWorkerMirroredStrategy workers (one replica each, the tutorial's
    auto-shard) feed each replica the rows MirroredStrategy's two replicas get, from the same
    initial weights: the two records PASS against each other."""
    workers = record("keras_mnist.py", tmp_path / "mwms", "--multi-worker", "2")
    cmp, found = names(workers, keras_run, tmp_path)
    assert cmp.passed and found == [], cmp.verdict
    assert cmp.a.config.json["strategy"] == "MultiWorkerMirroredStrategy"
    assert [len(r.exact) for r in cmp.a.rows(1)] == [64, 64]
    assert len(cmp.a.steps) == 16 and all((s.grad_norm or 0) > 0 for s in cmp.a.steps)
