"""Convergence on real MNIST: both backends reach the accuracy target and agree on it."""

import pytest

from dualtrain.parity.checks import check_eval
from dualtrain.records.record import read_run
from testkit.cli import ROOT


def test_mlp_two_epochs_world_two(runs):
    # configs/mnist_mlp.yaml as written: MLP, 2 epochs, world 2 (torch DDP gloo / TF
    # MirroredStrategy)
    a, b = read_run(runs("torch")), read_run(runs("tf"))
    acc_a, acc_b = a.summary["test_accuracy"], b.summary["test_accuracy"]
    print(f"MLP 2 epochs: torch {100 * acc_a:.2f}%, tf {100 * acc_b:.2f}%")
    assert acc_a >= 0.97 and acc_b >= 0.97
    assert abs(acc_a - acc_b) * 100 <= 0.3
    check = check_eval(a, b)
    assert check.passed, check.detail


@pytest.mark.slow
def test_mlp_fp64_converges_like_fp32(runs):
    # The same 2-epoch spec in float64 (the reference pair dualtrain compare runs): same accuracy
    # target.
    ref = runs.reference()
    acc = {r.summary["backend"]: r.summary["test_accuracy"] for r in (ref.a, ref.b)}
    print(f"MLP 2 epochs fp64: torch {100 * acc['torch']:.2f}%, tf {100 * acc['tf']:.2f}%")
    assert acc["torch"] >= 0.97 and acc["tf"] >= 0.97
    assert acc["torch"] == acc["tf"]  # the fp64 pair agrees to rounding: the same test predictions
    assert ref.a.summary["precision"] == "fp64" == ref.b.summary["precision"]


@pytest.mark.slow  # two full CNN epochs on each backend (~3 min): the sweep, for CI's time; the
@pytest.mark.sweep  # CNN config runs once in CI (test_example_specs.py::test_config_runs)
def test_cnn_two_epochs_world_two(runs):
    cnn = str(ROOT / "configs" / "mnist_cnn.yaml")
    a, b = read_run(runs("torch", config=cnn)), read_run(runs("tf", config=cnn))
    acc_a, acc_b = a.summary["test_accuracy"], b.summary["test_accuracy"]
    print(f"CNN 2 epochs: torch {100 * acc_a:.2f}%, tf {100 * acc_b:.2f}%")
    assert acc_a >= 0.99 and acc_b >= 0.99
    assert abs(acc_a - acc_b) * 100 <= 0.3
