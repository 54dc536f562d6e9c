"""The Python API (docs/python-api.md) where no run starts: overrides and usage errors raise the
CLI's user errors, dualtrain.experiment, and compare of finished (synthetic) runs. Real runs through
dualtrain.run / resume / compare: tests/integration/test_python_api_runs.py.
"""

from __future__ import annotations

import ast
import json

import pytest
import yaml

import dualtrain
from dualtrain.cli.options import build_spec
from dualtrain.spec import load_spec
from testkit.cli import ROOT
from testkit.synth import base_loss, make_run

CONFIG = ROOT / "configs" / "mnist_mlp.yaml"


@pytest.mark.parametrize(
    "kwargs, loader_set",
    [
        ({"train": {"epochz": 1}}, ["train.epochz=1"]),
        ({"set": ["optimizer.schedule.nam=step"]}, ["optimizer.schedule.nam=step"]),
        ({"epochs": 1}, ["epochs=1"]),
        ({"optimizer": {"lr": -1}}, ["optimizer.lr=-1"]),
        ({"precision": "fp8"}, ["precision.dtype=fp8"]),
    ],
)
def test_a_bad_override_is_the_loaders_user_error_and_writes_nothing(tmp_path, kwargs, loader_set):
    with pytest.raises(dualtrain.UserError) as loader:
        load_spec(CONFIG, loader_set)
    out = tmp_path / "run"
    with pytest.raises(dualtrain.UserError) as api:
        dualtrain.run(CONFIG, "torch", out=out, **kwargs)
    assert str(api.value) == str(loader.value) and "\n" not in str(api.value)
    assert not out.exists()
    with pytest.raises(dualtrain.UserError) as cmp:
        dualtrain.compare(CONFIG, out=tmp_path / "cmp", **kwargs)
    assert str(cmp.value) == str(loader.value) and not (tmp_path / "cmp").exists()


def test_unknown_key_names_its_path(tmp_path):
    with pytest.raises(
        dualtrain.UserError, match=r"unknown key 'data\.train_limt' \(valid keys in data"
    ):
        dualtrain.run(CONFIG, "torch", data={"train_limt": 5}, out=tmp_path / "r")


def test_experiment_applies_overrides_like_the_cli():
    # the CLI's order: --set, then --world-size, then --precision (later wins)
    got = dualtrain.experiment(
        CONFIG,
        train={"epochs": 1},
        set=["optimizer.lr=0.05", "distribution.world_size=4"],
        world_size=2,
        precision="fp16",
    )
    assert got == build_spec(str(CONFIG), 2, "fp16", ("train.epochs=1", "optimizer.lr=0.05"))
    raw = yaml.safe_load(CONFIG.read_text())
    assert dualtrain.experiment(raw) == load_spec(CONFIG)  # a dict with the YAML schema
    spec = load_spec(CONFIG)
    assert dualtrain.experiment(spec) is spec and dualtrain.experiment(spec, seed=1).seed == 1
    # nested sections merge; precision="fp16" sets the dtype only
    ls = dualtrain.experiment(CONFIG, precision={"loss_scale": {"init": 1024.0}})
    ls = dualtrain.experiment(ls, precision="fp16", optimizer={"schedule": {"name": "constant"}})
    assert ls.precision.loss_scale.init == 1024.0 and ls.precision.dtype.value == "fp16"
    assert ls.optimizer.schedule.name.value == "constant" and ls.optimizer.momentum == 0.9
    # a model given by layers replaces the preset (they are mutually exclusive)
    m = dualtrain.experiment(
        CONFIG, model={"layers": [{"type": "flatten"}, {"type": "dense", "units": 10}]}
    )
    assert m.model.preset is None and len(m.model.layers) == 2
    with pytest.raises(dualtrain.UserError, match="spec must be a path to a YAML file"):
        dualtrain.experiment(42)


def test_compare_finished_runs_matches_verdict_json(tmp_path, capsys):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", backend="tf", loss=lambda s: base_loss(s) + 1e-7)
    res = dualtrain.compare(a, b, out=tmp_path / "r")
    printed = capsys.readouterr().out.splitlines()
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert isinstance(res, dualtrain.CompareResult)
    assert res.passed is v["passed"] is True and res.verdict == v["verdict"]
    assert res.category is v["category"] is None and res.semantics_checked is v["semantics_checked"]
    assert [(c.name, c.passed, c.group) for c in res.checks] == [
        (c["name"], c["passed"], c["group"]) for c in v["checks"]
    ]
    assert (
        res.check("trajectory").value
        == v["checks"][[c["name"] for c in v["checks"]].index("trajectory")]["value"]
    )
    assert res.run_a == a and res.run_b == b and res.reference_runs is None
    assert res.reports == {
        "json": tmp_path / "r/verdict.json",
        "md": tmp_path / "r/report.md",
        "html": tmp_path / "r/report.html",
    }
    assert all(p.is_file() for p in res.reports.values())
    assert printed[-2] == res.verdict  # the CLI's table and verdict, then where the report is
    assert printed[-1].startswith(f"dualtrain compare: report: {tmp_path / 'r/report.html'}")

    # a failing pair (another lr), quietly: the result says why, nothing is printed
    bad = make_run(tmp_path / "bad", backend="tf", lr=lambda s: 0.1)
    res = dualtrain.compare(a, bad, out=tmp_path / "r2", quiet=True)
    assert capsys.readouterr().out == ""
    v = json.loads((tmp_path / "r2" / "verdict.json").read_text())
    assert res.passed is v["passed"] is False and res.category == v["category"]
    assert res.diagnosis.cause == v["diagnosis"]["cause"] == "different learning rate"
    assert not res.check("lr").passed


def test_compare_usage_errors_are_one_line(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    for call, words in [
        (lambda: dualtrain.compare(a, b, train={"epochs": 1}), "need a spec"),
        (lambda: dualtrain.compare(a, b, reference="none"), "goes with a spec"),
        (lambda: dualtrain.compare(CONFIG, reference="fp32"), "--reference must be one of"),
        (lambda: dualtrain.compare(CONFIG, reference_runs=(a, b)), "reference_runs is for"),
        (lambda: dualtrain.compare(a), "not a run"),
        (lambda: dualtrain.compare(a, tmp_path / "nope"), "run directory not found"),
        (lambda: dualtrain.compare(), "compare needs a spec, two finished runs, or against"),
        (lambda: dualtrain.compare(against=a), "--against takes the folder of a finished"),
        (lambda: dualtrain.compare(CONFIG, against=a), "against=SAVED replays the saved"),
        (lambda: dualtrain.compare(against=a, world_size=2), "Received: world_size"),
    ]:
        with pytest.raises(dualtrain.UserError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_compare_refuses_to_be_one_rank_of_an_external_launch(tmp_path, monkeypatch):
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for k, v in torchrun.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(dualtrain.UserError, match="launches its own workers"):
        dualtrain.compare(CONFIG, out=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_dualtrain_compare_is_the_api_compare_whatever_was_imported(tmp_path):
    import dualtrain.driver.compare
    import dualtrain.parity
    from dualtrain.api import compare

    assert dualtrain.compare is compare  # no subpackage of that name shadows the function
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    assert (
        dualtrain.parity.compare_dirs(a, b).passed
        == compare(a, b, out=tmp_path / "r", quiet=True).passed
    )


def test_the_example_uses_only_the_public_api():
    path = ROOT / "examples" / "python_api.py"
    tree = ast.parse(path.read_text(), str(path))
    compile(tree, str(path), "exec")
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports and all(
        isinstance(n, ast.Import) and [a.name for a in n.names] == ["dualtrain"] for n in imports
    ), "the example imports only `dualtrain`"
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "dualtrain"
    }
    assert used and used <= set(dualtrain.__all__), used - set(dualtrain.__all__)
    assert {"run", "compare"} <= used


def test_errors_are_exported():
    from dualtrain import errors

    assert dualtrain.UserError is errors.UserError and dualtrain.RunFailed is errors.RunFailed


def test_the_docs_example_errors_are_what_the_api_raises():
    # docs/python-api.md shows three mistakes and their one-line errors: they stay the real ones
    doc = (ROOT / "docs" / "python-api.md").read_text()
    spec = str(ROOT / "configs" / "mnist_mlp.yaml")
    for kw in ({"train": {"epochz": 1}}, {"epochs": 1}, {"optimizer": {"lr": -1}}):
        with pytest.raises(dualtrain.UserError) as err:
            dualtrain.experiment(spec, **kw)
        shown = f"{type(err.value).__module__}.{type(err.value).__qualname__}: {err.value}\n"
        assert shown in doc, shown  # what the traceback's last line prints (a UserError kind)
