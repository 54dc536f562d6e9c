"""A Hugging Face Trainer fine-tuning a tiny random-init BERT against KerasHub's port of it (made
by KerasHub's own converter from the saved folder, offline), both recorded (examples/audit/hub):
the faithful pair PASSes with its initial weights paired by their values (KerasHub's layout is
another), and what is planted on either side is named with the value to write."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from dualtrain.audit.compare import compare_recorded  # noqa: E402
from tests.audit.scripts import record  # noqa: E402

SIZE = ("--train-size", "256")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub")
    return record("hub/hf_bert.py", d / "hf", *SIZE, "--initial", str(d / "initial")), d


@pytest.fixture(scope="module")
def keras_port(hf_run):
    run, d = hf_run
    flags = ("--initial", str(d / "initial"), "--torch-record", str(run))
    return record("hub/keras_hub_bert.py", d / "keras", *SIZE, *flags, timeout=400)


@pytest.mark.slow
def test_the_trainer_and_its_keras_hub_port_pass(hf_run, keras_port):
    cmp = compare_recorded(hf_run[0], keras_port)
    assert cmp.passed and not cmp.findings, cmp.verdict
    init = {c.name: c for c in cmp.checks}["initial weights"]
    assert "41 arrays, bit-identical values (41 paired by their values" in init.detail


#: (the script planted, its flags, the difference named, the value its fix writes)
PLANTS = [
    ("hf_bert.py", ("--lr", "5e-4"), "different base learning rate", "learning_rate=0.001"),
    ("hf_bert.py", ("--warmup-steps", "4"), "warmup in one run only", "warmup_steps=0"),
    ("hf_bert.py", ("--weight-decay", "0.01"), "optimizer conventions", "weight_decay=0.01"),
    ("hf_bert.py", ("--max-grad-norm", "0"), "gradient clipping in one", "max_grad_norm=1"),
    ("keras_hub_bert.py", ("--epsilon", "1e-7"), "optimizer conventions", "epsilon=1e-08"),
    ("keras_hub_bert.py", ("--constant-lr",), "different lr schedules", "PolynomialDecay(0.001"),
    ("keras_hub_bert.py", ("--clipnorm", "0"), "gradient clipping in one", "global_clipnorm=1"),
]


@pytest.mark.slow
@pytest.mark.sweep  # 7 more runs of a Trainer or a KerasHub fit: the full sweep's
@pytest.mark.parametrize("script,flags,name,value", PLANTS, ids=[p[2] for p in PLANTS])
def test_a_difference_planted_in_the_hub_pair_is_named_with_its_value(
    hf_run, keras_port, tmp_path, script, flags, name, value
):
    run, d = hf_run
    if script == "hf_bert.py":
        extra = ("--initial", str(tmp_path / "initial"), *flags)
        a, b = record(f"hub/{script}", tmp_path / "a", *SIZE, *extra), keras_port
    else:
        extra = ("--initial", str(d / "initial"), "--torch-record", str(run), *flags)
        a, b = run, record(f"hub/{script}", tmp_path / "b", *SIZE, *extra, timeout=400)
    cmp = compare_recorded(a, b)
    assert not cmp.passed, cmp.verdict
    found = [f for f in cmp.findings if f.name.startswith(name)]
    assert found, [f.name for f in cmp.findings]
    assert any(value in x for x in found[0].fixes), found[0].fixes
    assert not [c for c in found[0].fix_checks if c and not c.holds], found[
        0
    ].fix_lines()  # none NOT confirmed
