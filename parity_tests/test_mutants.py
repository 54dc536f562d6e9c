"""Detection power: every semantic mutant of tools/mutants/ makes the fp64 reference pair
fail with the right cause, while the unmutated pair passes. The smallest detected sizes are measured
by ``python -m tools.detection_power`` (the table in docs/parity.md §7)."""

import json

import pytest

from dualtrain.parity import compare_records
from dualtrain.parity.diagnose import SEMANTICS
from dualtrain.records.record import read_run
from testkit.cli import run_cli
from testkit.parity_runs import MLP
from tools.mutants import MUTANTS, SPECS, hook

# adam, bce, val, bn, bn_mw and stride2: the slow set (CI) runs them; mse keeps a non-cross-entropy
# loss in the default, sgd the plain pair
SLOW_SPECS = ("adam", "adamw", "rmsprop", "bce", "val", "bn", "bn_mw", "stride2")


@pytest.mark.parametrize(
    "spec", [s if s not in SLOW_SPECS else pytest.param(s, marks=pytest.mark.slow) for s in SPECS]
)
def test_unmutated_pair_passes(runs, spec):
    cmp = compare_records(read_run(runs("torch", *SPECS[spec])), read_run(runs("tf", *SPECS[spec])))
    assert cmp.passed, cmp.diagnosis.summary()


# momentum, weight_decay and adam_eps are the same kind of mutant as lr_scale (an optimizer constant
# off by a little), keras_bn_replica_stats the same kind as keras_bn_variance: the slow set (CI)
# runs them. same_padding_asym (a layer's semantics in the Keras port of the spec) too: the default
# suite keeps that kind in the model pairs' flatten_hwc (parity_tests/test_model_pairs.py).
SLOW_MUTANTS = (
    "same_padding_asym",
    "momentum",
    "weight_decay",
    "adam_eps",
    "keras_bn_replica_stats",
    "bce_label_smoothing",
    "validation_tail",
)


@pytest.mark.parametrize(
    "name",
    [n if n not in SLOW_MUTANTS else pytest.param(n, marks=pytest.mark.slow) for n in MUTANTS],
)
def test_mutant_fails_with_its_cause(runs, name):
    m = MUTANTS[name]
    a = read_run(runs("torch", *SPECS[m.spec]))
    b = read_run(runs("tf", *SPECS[m.spec], env=hook(name)))
    assert b.summary["test_hook"].endswith(f"apply={name}")  # the mutant really ran
    cmp = compare_records(a, b)
    d = cmp.diagnosis
    print(f"{name}: {cmp.diagnosis.summary()}; failed {d.failed_checks}")
    assert not cmp.passed
    assert d.cause == m.cause and d.category == SEMANTICS, d.summary()
    # the records stay clean unless the mutant is about them: the fp64 pair is what sees it
    if m.cause == SEMANTICS:
        assert cmp.check("lr").passed and cmp.check("sharding").passed and cmp.check("spec").passed
        assert not cmp.check(m.seen_by).passed


@pytest.mark.slow
def test_compare_cli_names_the_semantic_cause(tmp_path):
    # lr x (1 + 1e-6) in the tf backend only, through the whole `dualtrain compare`: every check
    # that fails is explained by the fp64 pair disagreeing, so the verdict is "semantics differ"
    # (not "numerics") and the cause the reference pair.
    out = tmp_path / "cmp"
    res = run_cli(
        "compare",
        "--config",
        MLP,
        *[a for o in SPECS["sgd"][:-1] if "precision" not in o for a in ("--set", o)],
        "--set",
        "optimizer.lr=0.1",
        "--out",
        str(out),
        timeout=600,
        env=hook("lr_scale", 1e-6),
    )
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "verdict: FAIL, semantics differ" in res.stdout
    v = json.loads((out / "verdict.json").read_text())
    checks = {c["name"]: c for c in v["checks"]}
    print({n: (c["passed"], c["value"]) for n, c in checks.items()})
    assert not checks["reference_loss"]["passed"] and v["category"] == "semantics differ"
    assert v["diagnosis"]["cause"] == "semantics differ"
    assert all(checks[n]["passed"] for n in ("spec", "sharding", "init_weights", "lr"))
