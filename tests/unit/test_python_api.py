"""The Python API (docs/python-api.md): dualtrain.run / resume / compare / experiment on real runs.

Each real run is tiny (3 steps on 640 MNIST samples, one replica) and starts its own worker
processes; this process never imports a framework.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import subprocess
import sys

import pytest
import yaml

import dualtrain
from dualtrain.cli.options import build_spec
from dualtrain.record import read_run
from dualtrain.spec import load_spec
from tests.compare.synth import base_loss, make_run
from tests.conftest import ROOT, cli_env

CONFIG = ROOT / "configs" / "mnist_mlp.yaml"
TINY = {"train": {"max_steps": 3, "log_every": 1}, "data": {"train_limit": 640, "test_limit": 200}}
TORCH = importlib.util.find_spec("torch") is not None
TF = (ROOT / "dualtrain/backends/tf/worker.py").is_file() and all(
    importlib.util.find_spec(m) is not None for m in ("tensorflow", "keras"))
needs_torch = pytest.mark.skipif(not TORCH, reason="needs torch (real runs)")


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> tuple[dualtrain.RunResult, str]:
    """One real torch run through dualtrain.run, overrides of each kind; and what it printed."""
    out = tmp_path_factory.mktemp("api") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # dualtrain's own lines (the workers write to fd 1)
        res = dualtrain.run(CONFIG, "torch", **TINY, optimizer={"lr": 0.05}, seed=3, world_size=1,
                            out=out)
    return res, printed.getvalue()


@needs_torch
def test_run_returns_the_run_it_wrote(torch_run):
    res, printed = torch_run
    assert isinstance(res, dualtrain.RunResult) and res.is_chief and res.backend == "torch"
    on_disk = json.loads((res.run_dir / "summary.json").read_text())
    assert res.summary == on_disk
    assert res.steps == on_disk["steps"] == 3
    assert res.test_accuracy == on_disk["test_accuracy"] and res.test_loss == on_disk["test_loss"]
    assert res.samples_per_s == on_disk["train_samples_per_s"]
    # spec.yaml holds the overrides, merged into the YAML's sections (the rest of them kept)
    spec = yaml.safe_load((res.run_dir / "spec.yaml").read_text())
    assert spec["train"]["max_steps"] == 3 and spec["data"]["train_limit"] == 640
    assert spec["optimizer"]["lr"] == 0.05 and spec["optimizer"]["momentum"] == 0.9
    assert spec["optimizer"]["schedule"]["name"] == "cosine" and spec["data"]["batch_size"] == 128
    assert spec["seed"] == 3 and spec["distribution"]["world_size"] == 1
    assert res.spec == load_spec(res.run_dir / "spec.yaml")
    rec = res.metrics()
    assert [r["step"] for r in rec.train] == [1, 2, 3]
    assert rec.eval[-1]["accuracy"] == res.test_accuracy
    assert set(res.final_weights()) == {"1.weight", "1.bias", "3.weight", "3.bias", "5.weight",
                                        "5.bias"}
    assert printed.splitlines()[-1] == (f"dualtrain: torch run finished: test accuracy "
                                        f"{100 * res.test_accuracy:.2f}%, {res.samples_per_s:,.0f} "
                                        f"samples/s -> {res.run_dir}")


@pytest.mark.parametrize("kwargs, loader_set", [
    ({"train": {"epochz": 1}}, ["train.epochz=1"]),
    ({"set": ["optimizer.schedule.nam=step"]}, ["optimizer.schedule.nam=step"]),
    ({"epochs": 1}, ["epochs=1"]),
    ({"optimizer": {"lr": -1}}, ["optimizer.lr=-1"]),
    ({"precision": "fp8"}, ["precision.dtype=fp8"]),
])
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
    with pytest.raises(dualtrain.UserError,
                       match=r"unknown key 'data\.train_limt' \(valid keys in data"):
        dualtrain.run(CONFIG, "torch", data={"train_limt": 5}, out=tmp_path / "r")


def test_experiment_applies_overrides_like_the_cli():
    # the CLI's order: --set, then --world-size, then --precision (later wins)
    got = dualtrain.experiment(CONFIG, train={"epochs": 1}, set=["optimizer.lr=0.05",
                                                                 "distribution.world_size=4"],
                               world_size=2, precision="fp16")
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
    m = dualtrain.experiment(CONFIG, model={"layers": [{"type": "flatten"},
                                                       {"type": "dense", "units": 10}]})
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
    assert [(c.name, c.passed, c.group) for c in res.checks] == \
        [(c["name"], c["passed"], c["group"]) for c in v["checks"]]
    assert res.check("trajectory").value == v["checks"][[c["name"] for c in v["checks"]]
                                                        .index("trajectory")]["value"]
    assert res.run_a == a and res.run_b == b and res.reference_runs is None
    assert res.reports == {"json": tmp_path / "r/verdict.json", "md": tmp_path / "r/report.md",
                           "html": tmp_path / "r/report.html"}
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
    ]:
        with pytest.raises(dualtrain.UserError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


@needs_torch
@pytest.mark.skipif(not TF, reason="needs the tf backend")
@pytest.mark.slow  # the CLI's compare --config runs this code in the default suite (test_compare_config)
def test_compare_a_spec_says_which_run_is_running(tmp_path, capfd):
    out = tmp_path / "cmp"
    res = dualtrain.compare(CONFIG, **TINY, world_size=1, reference="none", out=out)
    lines = [ln for ln in capfd.readouterr().out.splitlines()
             if ln.startswith("dualtrain compare:")]
    assert lines[0] == f"dualtrain compare: mnist_mlp: 2 runs, torch and tf -> {out}"
    assert lines[1] == f"dualtrain compare: run 1/2: torch fp32 -> {out / 'torch'}"
    assert lines[2].startswith("dualtrain compare: run 1/2 done: torch fp32 in ")
    assert lines[3] == f"dualtrain compare: run 2/2: tf fp32 -> {out / 'tf'}"
    assert lines[4].startswith("dualtrain compare: run 2/2 done: tf fp32 in ")
    assert lines[5].startswith(f"dualtrain compare: report: {out / 'report.html'}")
    v = json.loads((out / "verdict.json").read_text())
    assert res.passed is v["passed"] is True and not res.semantics_checked
    assert res.run_a == out / "torch" and res.run_b == out / "tf" and res.reference_runs is None
    assert read_run(res.run_a).summary["backend"] == "torch"


@needs_torch
@pytest.mark.slow  # the same paths as the CLI's own tests (default suite)
def test_a_failed_run_is_named_and_raises_run_failed(tmp_path, capfd):
    # rank 0 kills itself at step 2 of the first run (torch): compare stops there
    with pytest.raises(dualtrain.RunFailed, match="torch run failed"):
        dualtrain.compare(CONFIG, **TINY, world_size=1, reference="none", out=tmp_path / "c",
                          debug={"exit_rank": [2, 0]})
    out = capfd.readouterr().out
    assert "dualtrain compare: run 1/2 FAILED: torch fp32 after " in out
    assert "run 2/2" not in out


@needs_torch
@pytest.mark.slow  # the same paths as the CLI's own tests (default suite)
def test_resume_continues_a_killed_run(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(dualtrain.RunFailed):  # rank 0 dies at step 3, after the step-2 checkpoint
        dualtrain.run(CONFIG, "torch", data=TINY["data"], world_size=1, out=out, quiet=True,
                      train={"max_steps": 4, "checkpoint_every": 2, "log_every": 1},
                      debug={"exit_rank": [3, 0]})
    res = dualtrain.resume(out, quiet=True)
    assert res.run_dir == out and res.steps == 4 and res.backend == "torch"
    assert [r["step"] for r in res.metrics().train] == [1, 2, 3, 4]


def test_compare_refuses_to_be_one_rank_of_an_external_launch(tmp_path, monkeypatch):
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for k, v in torchrun.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(dualtrain.UserError, match="launches its own workers"):
        dualtrain.compare(CONFIG, out=tmp_path / "c")
    assert not (tmp_path / "c").exists()


RANK_SCRIPT = """
import json, os, sys
import dualtrain
res = dualtrain.run(sys.argv[1], "torch", train={"max_steps": 2, "log_every": 1},
                    data={"train_limit": 300, "test_limit": 100}, out=sys.argv[2])
with open(os.path.join(sys.argv[3], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"run_dir": None if res.run_dir is None else str(res.run_dir),
               "is_chief": res.is_chief, "world_size": res.spec.distribution.world_size,
               "steps": res.steps}, f)
"""


@needs_torch
@pytest.mark.slow  # the same paths as the CLI's own tests (default suite)
def test_under_torchrun_each_rank_gets_an_honest_result(tmp_path):
    from dualtrain.launch import free_port

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(script), str(CONFIG), str(out),
           str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=cli_env({"GLOO_SOCKET_IFNAME": "lo"}))
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines()
            if "dualtrain" in ln or "Error" in ln]
    assert proc.returncode == 0, "\n".join(said[-12:])
    chief = json.loads((tmp_path / "rank0.json").read_text())
    other = json.loads((tmp_path / "rank1.json").read_text())
    assert chief == {"run_dir": str(out), "is_chief": True, "world_size": 2, "steps": 2}
    assert other["run_dir"] is None and other["is_chief"] is False and other["world_size"] == 2
    assert proc.stdout.count("dualtrain: torch run finished") == 1  # the chief's line only


def test_import_dualtrain_stays_light():
    code = (
        "import sys\n"
        "import dualtrain\n"
        "light = sorted(m for m in sys.modules if m.startswith('dualtrain'))\n"
        "heavy = [m for m in ('numpy', 'yaml', 'click') if m in sys.modules]\n"
        "names = (dualtrain.run, dualtrain.compare, dualtrain.resume, dualtrain.experiment,\n"
        "         dualtrain.RunResult, dualtrain.CompareResult, dualtrain.Experiment,\n"
        "         dualtrain.UserError, dualtrain.RunFailed)\n"
        "import dualtrain.compare.report\n"  # binds the subpackage: still callable
        "from dualtrain import compare\n"
        "fw = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]\n"
        "print(light, heavy, fw, callable(dualtrain.compare), compare is dualtrain.compare)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=cli_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['dualtrain', 'dualtrain.errors', 'dualtrain.version'] [] [] True True"


def test_callable_compare_package_is_the_api_compare(tmp_path):
    import dualtrain.compare as package
    from dualtrain.api import compare

    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    assert package is dualtrain.compare and package.compare_dirs  # the subpackage, as before
    assert package(a, b, out=tmp_path / "r", quiet=True) == compare(a, b, out=tmp_path / "r",
                                                                    quiet=True)


def test_the_example_uses_only_the_public_api():
    path = ROOT / "examples" / "python_api.py"
    tree = ast.parse(path.read_text(), str(path))
    compile(tree, str(path), "exec")
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports and all(isinstance(n, ast.Import) and [a.name for a in n.names] == ["dualtrain"]
                           for n in imports), "the example imports only `dualtrain`"
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "dualtrain"}
    assert used and used <= set(dualtrain.__all__), used - set(dualtrain.__all__)
    assert {"run", "compare"} <= used


def test_errors_are_exported():
    from dualtrain import errors

    assert dualtrain.UserError is errors.UserError and dualtrain.RunFailed is errors.RunFailed
