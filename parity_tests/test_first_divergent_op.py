"""The first divergent operation (issue 46 item 1; dualtrain.parity.replay): a semantic mutant
planted in the TF backend through the worker hook, replayed as compare replays the fp64 pair up to
its first divergent step, is named by the operation it changes (the loss, a gradient, an update,
a running statistic) and, where the mechanism is a known one, by it; the unmutated pair has no
first divergent operation."""

import json

import pytest

from dualtrain.parity.op_finding import EVALUATION, GRADIENT, LOSS, RUNNING, UPDATE
from dualtrain.parity.replay import first_divergent_op
from dualtrain.spec import load_spec
from testkit.parity_runs import MLP
from tools.mutants import MUTANTS, PORTING_MUTANTS, SPECS, compare_fp64, hook


def _replayed(runs, spec: str, steps: int, mutant: str | None, backend: str = "tf"):
    sets = (
        *SPECS[spec],
        f"train.max_steps={steps}",
        "train.epochs=null",
        "train.checkpoint_every=1",
        f"train.keep_checkpoints={steps}",
        f"debug.dump_grads=[{', '.join(str(s) for s in range(1, steps + 1))}]",
        f"debug.dump_layers=[{', '.join(str(s) for s in range(1, steps + 1))}]",
    )
    env = hook(mutant, backend=backend) if mutant else None
    a = runs("torch", *sets, env=env if backend == "torch" else None)
    b = runs("tf", *sets, env=env if backend == "tf" else None)
    return a, b, load_spec(MLP, list(sets))


def test_the_unmutated_pair_has_no_first_divergent_operation(runs):
    a, b, spec = _replayed(runs, "adam", 3, None)
    assert first_divergent_op(a, b, spec) is None


# (mutant, its spec, steps replayed, the stage named, words the finding must hold)
CASES = [
    (
        "adam_eps",
        "adam",
        2,
        UPDATE,
        ["Adam's update of", "tf departs from the spec's rule", "eps 1e-07"],
    ),
    (
        "lr_scale",
        "sgd",
        2,
        UPDATE,
        ["SGD's update of", "tf's update is the spec's rule x 1.000001"],
    ),
    (
        "mse_half",
        "mse",
        1,
        LOSS,
        [
            "the loss of step 1 differs",
            "every layer's output agrees",
            "tf departs from the spec's rule: its loss is the spec's x 0.5 (the 1/2 (o - t)^2",
        ],
    ),
    ("keras_bn_variance", "bn", 1, RUNNING, ["running_var", "biased variance"]),
    (
        "validation_tail",
        "val",
        2,
        EVALUATION,
        ["the evaluation of the validation split after step 2", "the evaluated samples"],
    ),
    (
        "bce_label_smoothing",
        "bce",
        1,
        LOSS,
        [
            "the loss of step 1 differs",
            "every layer's output agrees",
            "tf departs from the spec's rule: label smoothing 1e-06",
        ],
    ),
]


# adam_eps keeps an update finding with its mechanism in the default suite, keras_bn_variance a
# running statistic in the CI slow part; the other stages run in the full sweep (make test-slow)
SLOW = ("keras_bn_variance",)
SWEEP = ("lr_scale", "mse_half", "validation_tail", "bce_label_smoothing")


def _marked(case: tuple, slow: tuple[str, ...], sweep: tuple[str, ...]):
    if case[0] in sweep:
        return pytest.param(*case, marks=[pytest.mark.slow, pytest.mark.sweep])
    return pytest.param(*case, marks=pytest.mark.slow) if case[0] in slow else case


@pytest.mark.parametrize(
    "mutant,spec,steps,stage,words",
    [_marked(c, SLOW, SWEEP) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_planted_mutant_is_named_by_its_operation(runs, mutant, spec, steps, stage, words):
    a, b, experiment = _replayed(runs, spec, steps, mutant)
    found = first_divergent_op(a, b, experiment)
    assert found is not None, MUTANTS[mutant].what
    print(f"{mutant}: {found.lead()}")
    assert found.stage == stage, found.lead()
    for w in words:
        assert w in found.lead(), found.lead()
    assert found.stage != GRADIENT or found.tensor


# a torch-side slot (amsgrad) and a tf-side running statistic (momentum convention) in the CI slow
# part; the other porting mistakes in the full sweep
PORTING_CI = ("amsgrad", "bn_momentum_convention")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [n if n in PORTING_CI else pytest.param(n, marks=pytest.mark.sweep) for n in PORTING_MUTANTS],
)
def test_a_porting_mistake_is_named_by_its_operation_and_mechanism(runs, name):
    m = PORTING_MUTANTS[name]
    a, b, spec = _replayed(runs, m.spec, 2, name, m.backend)
    found = first_divergent_op(a, b, spec)
    assert found is not None, m.what
    print(f"{name}: {found.lead()}")
    assert found.stage == m.stage, found.lead()
    for w in m.words:
        assert w in found.lead(), found.lead()


@pytest.mark.slow
def test_compare_leads_its_verdict_with_the_first_divergent_operation(tmp_path):
    # the whole `dualtrain compare` of a fp64 spec with Keras's Adam eps planted on the tf side:
    # the pair parts at step 2, compare replays it and the verdict names the update and its eps
    out = tmp_path / "cmp"
    res = compare_fp64(out, "adam", "adam_eps")
    assert res.returncode == 1, res.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    line = verdict["verdict"]
    assert "Adam's update of" in line and "eps 1e-07, Keras's default" in line, line
    assert "replaying" in res.stdout + res.stderr
    assert (out / "replay" / "torch" / "checkpoints").is_dir()
