"""Fixes checked to be fixes (issue 48 item 4): each value a fix writes is an edit of the recorded
configuration; written into a copy of the records, it clears its finding and brings no other,
or the report marks the fix NOT confirmed, saying what remained or came."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.remedy import applied, check_fixes
from dualtrain.parity.report.sections import findings_markdown
from dualtrain.records.verdict import Edit
from tests.audit.records import record, with_lrs

ADAM = {"type": "Adam", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0, "amsgrad": False}
KADAM = {"type": "Adam", "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8, "amsgrad": False}
SGD = {"type": "SGD", "momentum": 0.9, "dampening": 0, "nesterov": False, "weight_decay": 0}
KSGD = {"type": "SGD", "momentum": 0.9, "nesterov": False}
L2 = [{"layer": "fc", "kind": k, "type": "L2", "l2": 5e-5} for k in ("kernel", "bias")]

#: (torch optimizer, Keras optimizer, the Keras model's loss terms), each a difference planted
#: in a faithful pair's configuration
PLANTS = {
    "epsilon": (ADAM, KADAM | {"epsilon": 1e-7}, {}),
    "beta_2": (ADAM | {"betas": [0.9, 0.99]}, KADAM, {}),
    "amsgrad": (ADAM | {"amsgrad": True}, KADAM, {}),
    "coupled decay": (ADAM | {"weight_decay": 1e-4}, KADAM, {}),
    "keras decay": (ADAM, KADAM | {"weight_decay": 0.01}, {}),
    "adamw decay": (ADAM | {"type": "AdamW", "weight_decay": 0.01}, KADAM | {"type": "AdamW"}, {}),
    "decoupled adam": (
        ADAM | {"weight_decay": 0.01, "decoupled_weight_decay": True},
        KADAM | {"weight_decay": 0.02},
        {},
    ),
    "l2 against none": (SGD, KSGD, {"regularizers": L2}),
    "l2 against decay": (SGD | {"weight_decay": 1e-3}, KSGD, {"regularizers": L2}),
    "nesterov": (SGD | {"nesterov": True}, KSGD, {}),
    "momentum": (SGD, KSGD | {"momentum": 0.5}, {}),
}


def _pair(torch_opt, keras_opt, terms):
    a = record("torch", config={"optimizer": torch_opt})
    b = record("tf", config={"optimizer": keras_opt, "loss_terms": terms})
    return a, b


def _checked(a, b):
    return check_fixes(a, b, diagnose(a, b), diagnose)


def holds(f):
    """Each fix's check: True (it holds), False (NOT confirmed), None (no edits)."""
    return [None if c is None else c.holds for c in f.fix_checks]


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_fix_of_a_planted_optimizer_difference_is_checked_and_holds(plant):
    a, b = _pair(*PLANTS[plant])
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    assert len(f.edits) == 2 and all(f.edits), f  # the Keras fix and the torch one, as values
    assert holds(f) == [True, True], f.fix_checks
    for edits, tag in zip(f.edits, ("B", "A"), strict=True):
        assert {e.run for e in edits} == {tag}  # each fix edits its own script's run
    assert "checked: applied to a copy of the recorded configuration" in "\n".join(
        findings_markdown([f])
    )


def test_a_keras_sgd_decay_has_its_value_checked_and_torchs_side_says_it_has_none():
    a, b = _pair(SGD, KSGD | {"weight_decay": 0.01}, {})
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    assert "-> weight_decay=None" in f.fixes[0], f.fixes
    assert "torch's SGD has no decoupled weight decay" in f.fixes[1], f.fixes
    assert holds(f) == [True, None], f.fix_checks


def test_a_fix_with_a_wrong_value_is_not_confirmed():
    """The check fails on a planted wrong value: epsilon written as 1e-6 where 1e-8 is the
    torch script's leaves the finding; a change of the optimizer's type brings another."""
    a, b = _pair(ADAM, KADAM | {"epsilon": 1e-7}, {})
    (f,) = [f for f in diagnose(a, b) if f.name.startswith("optimizer conventions")]
    f.edits = [[Edit("B", ("optimizer", "epsilon"), 1e-6)], [Edit("A", ("optimizer", "type"), "X")]]
    check_fixes(a, b, [f], diagnose)
    assert "epsilon=1e-06), it leaves this finding" in f.fix_checks[0].said, f.fix_checks
    assert "it brings ['different optimizers']" in f.fix_checks[1].said, f.fix_checks
    text = "\n".join(findings_markdown([f]))
    assert text.count("NOT confirmed") == 2, text


def test_same_framework_settings_fix_with_values_and_holds():
    a = record("torch", config={"optimizer": ADAM})
    b = record("torch", config={"optimizer": ADAM | {"eps": 1e-6, "amsgrad": True}})
    (f,) = [f for f in _checked(a, b) if f.name == "different optimizer settings"]
    assert "amsgrad=True, eps=1e-06 (as B)" in f.fixes[0], f.fixes
    assert "or amsgrad=False, eps=1e-08 (as A)" in f.fixes[1], f.fixes
    assert holds(f) == [True, True]


def test_a_loss_scale_fix_that_leaves_a_difference_is_not_confirmed():
    """The loss-scale fix writes the initial scale and the growth interval: it holds where those
    are what differs, and is marked NOT confirmed where the growth factor differs too (the check
    catches a fix that does not cover its evidence)."""
    rule = {"initial_scale": 65536.0, "growth_interval": 2000, "growth_factor": 2.0}
    rule |= {"backoff_factor": 0.5, "type": "GradScaler"}
    keras = rule | {"initial_scale": 32768.0, "type": "LossScaleOptimizer"}
    a = record("torch", config={"loss_scale": rule})
    b = record("tf", config={"loss_scale": keras})
    (f,) = [f for f in _checked(a, b) if f.name.startswith("loss-scale defaults")]
    assert holds(f) == [True], f.fix_checks
    b = record("tf", config={"loss_scale": keras | {"growth_factor": 3.0}})
    (f,) = [f for f in _checked(a, b) if f.name.startswith("loss-scale defaults")]
    assert "it leaves this finding" in f.fix_checks[0].said, f.fix_checks


def test_an_edit_writes_a_copy_and_an_element_of_a_tuple_option():
    a = record("torch", config={"optimizer": ADAM})
    edited = applied(a, "A", [Edit("A", ("optimizer", "betas.1"), 0.99), Edit("B", ("x",), 1)])
    assert edited.config.json["optimizer"]["betas"] == [0.9, 0.99] and "x" not in edited.config.json
    assert a.config.json["optimizer"]["betas"] == [0.9, 0.999]  # the record itself unchanged


def _bert_like():
    """A torch AdamW with a Hugging Face Trainer's two groups (biases and LayerNorm weights
    without decay) against a Keras AdamW, the weights in a converter's layout (paired by value)."""
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(3, 4)).astype(np.float32)
    torch_w = {
        "dense.weight": kernel.T.copy(),
        "dense.bias": np.zeros(4, np.float32),
        "norm.weight": np.ones(4, np.float32),
        "norm.bias": np.zeros(4, np.float32) + 0.5,
    }
    keras_w = {
        "encoder/dense/kernel": kernel,
        "encoder/dense/bias": np.zeros(4, np.float32),
        "encoder/norm/gamma": np.ones(4, np.float32),
        "encoder/norm/beta": np.zeros(4, np.float32) + 0.5,
    }
    groups = [{"weight_decay": 0.01}, {"weight_decay": 0.0}]
    params = [["dense.weight"], ["dense.bias", "norm.weight", "norm.bias"]]
    adamw = ADAM | {"type": "AdamW", "weight_decay": 0.01, "groups": groups}
    a = record("torch", config={"optimizer": adamw | {"group_params": params}})
    own = {"encoder/dense/kernel": "kernel", "encoder/dense/bias": "bias"}
    own |= {"encoder/norm/gamma": "gamma", "encoder/norm/beta": "beta"}
    keras = KADAM | {"type": "AdamW", "weight_decay": 0.0}
    b = record("tf", config={"optimizer": keras, "variable_names": own})
    return replace(a, weights_init=torch_w), replace(b, weights_init=keras_w)


def test_a_decay_free_group_is_excluded_on_the_keras_side_by_name_and_checked():
    """A Hugging Face Trainer's AdamW decays its weights but not its biases and LayerNorm
    weights (a second group): the Keras fix writes weight_decay and excludes the variables that
    group holds (found by the weights' pairing), and the check confirms it. Without the
    exclusion (the fix before this test), writing weight_decay alone brought Keras's decay of
    every variable, and the check said NOT confirmed."""
    a, b = _bert_like()
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    want = "weight_decay=0.01, opt.exclude_from_weight_decay(var_names=['beta', 'bias', 'gamma'])"
    assert want in f.fixes[0], f.fixes
    assert holds(f) == [True, True], f.fix_lines()
    f.edits[0] = [e for e in f.edits[0] if e.path[-1] != "no_decay"]  # the exclusion left out
    check_fixes(a, b, [f], diagnose)
    assert "it leaves this finding" in f.fix_checks[0].said, f.fix_checks
    # Keras excluding other variables than torch's group: named
    b.config = b.config.edited(
        {
            "optimizer": {
                **b.config.json["optimizer"],
                "weight_decay": 0.01,
                "no_decay": ["encoder/dense/bias"],
            }
        }
    )
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    assert "torch's parameter group(s) [1] hold 3 parameter(s) with weight_decay=0" in f.evidence
    assert "leaves 1 variable(s) out of its decay (exclude_from_weight_decay), 2 of them not" in (
        f.evidence
    ), f.evidence


def test_an_exclusion_and_a_decay_that_both_differ_are_one_fix_that_holds():
    a, b = _bert_like()
    b.config = b.config.edited(
        {
            "optimizer": {
                **b.config.json["optimizer"],
                "weight_decay": 0.02,
                "no_decay": ["encoder/dense/bias"],
            }
        }
    )
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    assert f.fixes[0].count("weight_decay=0.01") == 1, f.fixes
    assert f.fixes[0].count("exclude_from_weight_decay") == 1, f.fixes
    assert f.fix_checks[0].holds, f.fix_lines()


def test_an_exclusion_without_the_keras_variables_names_lists_the_variables():
    """A Keras record without its variables' own names (made with a weight map, or before
    they were recorded): the fix names the variables to exclude, not var_names it cannot know."""
    a, b = _bert_like()
    b.config = b.config.without("variable_names")
    (f,) = [f for f in _checked(a, b) if f.name.startswith("optimizer conventions")]
    want = "exclude_from_weight_decay(var_list=[the 3 variables encoder/dense/bias, encoder/norm"
    assert want in f.fixes[0], f.fixes
    assert f.fix_checks[0].holds


def _clips(*calls):
    made = [{"function": f, "limit": x, "steps": 4, "active_steps": 1} for f, x in calls]
    return {"clipping": {"watched": True, "steps": 4, "calls": made}}


def test_clipping_fixes_are_values_and_checked():
    """Clipping in one run only, and another clipping rule, each fixed with the value (Keras's
    global_clipnorm, torch's clip_grad_norm_ call) and checked on a copy of the records."""
    keras_plain = record("tf", config={"optimizer": {"type": "SGD"}})
    keras_half = record("tf", config={"optimizer": {"type": "SGD", "global_clipnorm": 0.5}})
    torch_one = record("torch", config=_clips(("clip_grad_norm_", 1.0)))
    torch_none = record("torch", config=_clips())
    for a, b, name, value in (
        (torch_one, keras_plain, "gradient clipping in one run only", "global_clipnorm=1"),
        (torch_none, keras_half, "gradient clipping in one run only", "clip_grad_norm_("),
        (torch_one, keras_half, "different gradient clipping", "global_clipnorm=1"),
        (
            keras_half,
            torch_one,
            "different gradient clipping",
            "clip_grad_norm_(model.parameters(), 0.5)",
        ),
    ):
        (f,) = [f for f in _checked(a, b) if f.name == name]
        assert value in f.fixes[0], f.fixes
        assert holds(f) == [True], f.fix_lines()


def test_a_base_lr_fix_scales_the_recorded_lrs_and_is_checked():
    """A base lr written is a scale of every recorded step's lr (its schedule scales with it):
    each side's fix clears the finding on a copy of the records. Where the schedules' shapes
    differ too, the base lr's fix still holds, and the shape stays named by its own finding."""
    a = with_lrs(record("torch"), [0.1, 0.1, 0.05, 0.05])
    b = with_lrs(record("tf"), [0.2, 0.2, 0.1, 0.1])
    (f,) = [f for f in _checked(a, b) if f.name == "different base learning rate"]
    assert "lr=0.2" in f.fixes[0] and "learning_rate=0.1" in f.fixes[1], f.fixes
    assert holds(f) == [True, True], f.fix_lines()
    c = with_lrs(record("tf"), [0.2, 0.2, 0.2, 0.2])  # another base and another schedule
    found = {f.name: f for f in _checked(a, c)}
    assert holds(found["different base learning rate"]) == [True, True]  # the other remains
    assert "different lr schedules" in found


def test_schedule_and_warmup_fixes_give_the_lrs_they_write_and_are_checked():
    """A schedule written (a linear decay to 0, a constant lr) and a warmup written or dropped
    are edits of the recorded lrs, computed from what the fix writes; each clears its finding.
    A decay written one step short (a planted off-by-one) leaves the finding."""
    linear = with_lrs(record("torch", losses=[1.0] * 8), [0.1 * (1 - i / 8) for i in range(8)])
    constant = with_lrs(record("tf", losses=[1.0] * 8), [0.1] * 8)
    (f,) = [f for f in _checked(linear, constant) if f.name == "different lr schedules"]
    assert "no scheduler (lr=0.1 at every step)" in f.fixes[0], f.fixes
    assert "PolynomialDecay(0.1, decay_steps=8, end_learning_rate=0.0)" in f.fixes[1], f.fixes
    assert holds(f) == [True, True], f.fix_lines()
    short = [0.1 * (1 - i / 7) for i in range(8)]
    f.edits[1] = [Edit("B", f.edits[1][0].path, short)]
    check_fixes(linear, constant, [f], diagnose)
    assert "it leaves this finding" in f.fix_checks[1].said, f.fix_checks
    warm = with_lrs(record("torch", losses=[1.0] * 8), [0.025, 0.05, 0.075, 0.1] + [0.1] * 4)
    (f,) = [f for f in _checked(warm, constant) if f.name == "warmup in one run only"]
    assert holds(f) == [True, True], f.fix_lines()
    assert any("no warmup: lr=0.1 from step 1" in x for x in f.fixes), f.fixes
    assert any("CosineDecay(initial_learning_rate=0.025" in x for x in f.fixes), f.fixes


def test_a_fix_that_brings_a_framework_convention_holds_and_says_it():
    """Keras's global_clipnorm under 2 replicas clips each replica's gradient before the
    all-reduce: writing it (the fix for a torch clip) brings that convention, which no line
    changes; the fix holds, and its note names the convention (measured on the Lightning pair,
    where the check first said NOT confirmed)."""
    torch_one = record("torch", world=2, config=_clips(("clip_grad_norm_", 1.0)))
    keras_plain = record("tf", world=2, config={"optimizer": {"type": "SGD"}})
    (f,) = [f for f in _checked(torch_one, keras_plain) if "clipping" in f.name]
    assert holds(f) == [True], f.fix_lines()
    assert "Keras clips each replica's gradient before the all-reduce" in f.fix_checks[0].said
    assert "it brings a convention of the frameworks" in f.fix_lines()[0][1]


def test_a_clipping_torch_cannot_write_is_said_not_left_empty():
    """Keras's clipnorm clips each variable's norm alone, which no torch option does: the fix to
    the torch run says so (it was an empty change) and carries no edits to check."""
    keras_each = record("tf", config={"optimizer": {"type": "SGD", "clipnorm": 1.0}})
    torch_one = record("torch", config=_clips(("clip_grad_norm_", 1.0)))
    (f,) = [f for f in _checked(keras_each, torch_one) if f.name == "different gradient clipping"]
    assert f.fixes[0].endswith(
        "-> clip as A: norm per variable 1 (torch has no clipping of each "
        "variable's norm alone: a clip_grad_norm_ per parameter)"
    ), f.fixes
    assert f.edits == [] and holds(f) == []
