"""A loss added by its declaration alone (dualtrain.core.losses: Huber) trains the same on both
backends: its fp64 pair agrees to the reference bound on a regression table, and a Huber of
another delta planted in one backend fails that pair."""

from __future__ import annotations

from dualtrain.parity.checks import Reference, check_reference_loss
from dualtrain.records.record import read_run
from testkit.cli import ROOT
from testkit.parity_runs import assert_reference_agrees
from testkit.worker_hooks import hook_env

DIABETES = str(ROOT / "configs" / "diabetes_regression.yaml")
#: Huber on the raw target (25..346): most rows in its linear part at the start, then the
#: quadratic one as the fit closes in; 3 epochs, 36 steps
HUBER = ("model.loss=huber", "train.epochs=3")


def test_a_huber_regression_fp64_pair_agrees(runs):
    ref = runs.reference(*HUBER, config=DIABETES)
    assert_reference_agrees(ref)
    assert ref.a.summary["metric"] == "mae" and ref.a.spec["model"]["loss"] == "huber"


def test_a_huber_of_another_delta_in_one_backend_fails_the_fp64_pair(runs):
    fp64 = (*HUBER, "precision.dtype=fp64")
    a = read_run(runs("torch", *fp64, config=DIABETES))
    hook = hook_env("testkit.worker_hooks:huber_delta=2.0")
    b = read_run(runs("tf", *fp64, config=DIABETES, env=hook))
    check = check_reference_loss(Reference(a, b))
    assert not check.passed and check.first_step == 1, check.detail
