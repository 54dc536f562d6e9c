"""The Python API (docs/python-api.md): dualtrain.run / resume / compare on real runs, and what
``import dualtrain`` loads (a fresh interpreter).

Each real run is tiny (3 steps on 640 MNIST samples, one replica) and starts its own worker
processes; this process never imports a framework. What needs no run (overrides, usage errors,
experiment, compare of finished runs): tests/api/test_python_api.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

import dualtrain
from dualtrain.records.record import read_run
from dualtrain.spec import load_spec
from testkit.cli import ROOT, cli_env

CONFIG = ROOT / "configs" / "mnist_mlp.yaml"
TINY = {"train": {"max_steps": 3, "log_every": 1}, "data": {"train_limit": 640, "test_limit": 200}}
TORCH = importlib.util.find_spec("torch") is not None
TF = (ROOT / "dualtrain/backends/tf/worker.py").is_file() and all(
    importlib.util.find_spec(m) is not None for m in ("tensorflow", "keras")
)
needs_torch = pytest.mark.skipif(not TORCH, reason="needs torch (real runs)")


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> tuple[dualtrain.RunResult, str]:
    """One real torch run through dualtrain.run, overrides of each kind; and what it printed."""
    out = tmp_path_factory.mktemp("api") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # dualtrain's own lines (the workers write to fd 1)
        res = dualtrain.run(
            CONFIG, "torch", **TINY, optimizer={"lr": 0.05}, seed=3, world_size=1, out=out
        )
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
    assert set(res.final_weights()) == {
        "1.weight",
        "1.bias",
        "3.weight",
        "3.bias",
        "5.weight",
        "5.bias",
    }
    assert printed.splitlines()[-1] == (
        f"dualtrain: torch run finished: test accuracy "
        f"{100 * res.test_accuracy:.2f}%, {res.samples_per_s:,.0f} "
        f"samples/s -> {res.run_dir}"
    )


@needs_torch
@pytest.mark.skipif(not TF, reason="needs the tf backend")
# the CLI's compare --config runs this code in the default suite (test_compare_config)
@pytest.mark.slow
def test_compare_a_spec_says_which_run_is_running(tmp_path, capfd):
    out = tmp_path / "cmp"
    res = dualtrain.compare(CONFIG, **TINY, world_size=1, reference="none", out=out)
    lines = [
        ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("dualtrain compare:")
    ]
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
    # rank 0 kills itself at step 2 of each run (debug.exit_rank holds for both backends): compare
    # still runs the other run (what finishes is judged), and with none left to compare it writes
    # the verdict naming both and raises the first failure
    with pytest.raises(dualtrain.RunFailed, match="torch run failed"):
        dualtrain.compare(
            CONFIG,
            **TINY,
            world_size=1,
            reference="none",
            out=tmp_path / "c",
            debug={"exit_rank": [2, 0]},
        )
    out = capfd.readouterr().out
    assert "dualtrain compare: run 1/2 FAILED: torch fp32 after " in out
    assert "dualtrain compare: run 2/2 FAILED: tf fp32 after " in out
    v = json.loads((tmp_path / "c" / "verdict.json").read_text())
    assert v["category"] == "run failed" and set(v["failed_runs"]) == {"torch", "tf"}


@needs_torch
@pytest.mark.slow  # the same paths as the CLI's own tests (default suite)
def test_resume_continues_a_killed_run(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(dualtrain.RunFailed):  # rank 0 dies at step 3, after the step-2 checkpoint
        dualtrain.run(
            CONFIG,
            "torch",
            data=TINY["data"],
            world_size=1,
            out=out,
            quiet=True,
            train={"max_steps": 4, "checkpoint_every": 2, "log_every": 1},
            debug={"exit_rank": [3, 0]},
        )
    res = dualtrain.resume(out, quiet=True)
    assert res.run_dir == out and res.steps == 4 and res.backend == "torch"
    assert [r["step"] for r in res.metrics().train] == [1, 2, 3, 4]


RANK_SCRIPT = """
import faulthandler, json, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump if a rank hangs
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
    from dualtrain.launch.local import free_port

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        str(CONFIG),
        str(out),
        str(tmp_path),
    ]
    proc = _run_or_dump_stacks(cmd, timeout=180, env=cli_env({"GLOO_SOCKET_IFNAME": "lo"}))
    said = [
        ln for ln in (proc.stdout + proc.stderr).splitlines() if "dualtrain" in ln or "Error" in ln
    ]
    assert proc.returncode == 0, "\n".join(said[-12:])
    chief = json.loads((tmp_path / "rank0.json").read_text())
    other = json.loads((tmp_path / "rank1.json").read_text())
    assert chief == {"run_dir": str(out), "is_chief": True, "world_size": 2, "steps": 2}
    assert other["run_dir"] is None and other["is_chief"] is False and other["world_size"] == 2
    assert proc.stdout.count("dualtrain: torch run finished") == 1  # the chief's line only


def _run_or_dump_stacks(cmd: list[str], *, timeout: float, env: dict[str, str]):
    """``subprocess.run(cmd)``; if it outlives ``timeout`` (a run takes ~7 s), every rank prints its
    Python stacks (SIGUSR1, registered by RANK_SCRIPT) before it is killed, and the test fails with
    them (CI saw this test hang once, 2026-11-26, with nothing to say where)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        for pid in kids.stdout.split():
            os.kill(int(pid), signal.SIGUSR1)
        time.sleep(3)
        for pid in [*kids.stdout.split(), str(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"torchrun did not finish in {timeout:g} s; its output and stacks:\n{out[-12000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_import_dualtrain_stays_light():
    code = (
        "import sys\n"
        "import dualtrain\n"
        "light = sorted(m for m in sys.modules if m.startswith('dualtrain'))\n"
        "heavy = [m for m in ('numpy', 'yaml', 'click') if m in sys.modules]\n"
        "names = (dualtrain.run, dualtrain.compare, dualtrain.resume, dualtrain.experiment,\n"
        "         dualtrain.RunResult, dualtrain.CompareResult, dualtrain.Experiment,\n"
        "         dualtrain.UserError, dualtrain.RunFailed)\n"
        "import dualtrain.parity.report\n"  # loading the report changes nothing of the API
        "from dualtrain import compare\n"
        "fw = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]\n"
        "print(light, heavy, fw, callable(dualtrain.compare), compare is dualtrain.compare)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=cli_env()
    )
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip()
        == "['dualtrain', 'dualtrain.errors', 'dualtrain.version'] [] [] True True"
    )
