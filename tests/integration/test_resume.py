"""Checkpoints, exact resume and automatic restart, on real runs of both backends.

Every case trains the MLP on 2,600 MNIST samples for 2 epochs (42 steps; the last step of each epoch
is a partial, uneven batch), checkpointing every 10 steps. "Same run" means: final weights equal bit
for bit, metrics.jsonl equal line for line except the samples/s timing, shards.jsonl equal.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.records.tbevents import read_scalars
from dualtrain.runtime import checkpoint
from testkit.cli import ROOT, cli_env, require, run_cli

require("torch", "tensorflow")

MLP = ROOT / "configs" / "mnist_mlp.yaml"
BASE = (
    "data.train_limit=2600",
    "data.test_limit=1000",
    "train.epochs=2",
    "train.checkpoint_every=10",
    "train.log_every=1000",
)
CASES = {
    "torch-w3": ("torch", ("distribution.world_size=3",)),
    "tf-mirrored-w2": ("tf", ("distribution.world_size=2",)),
    "tf-multi_worker-w2": ("tf", ("distribution.world_size=2", "tf.strategy=multi_worker")),
}
# configs/mnist_vit.yaml's layers (patches, position, attention, layernorm, gelu, dropout on
# tokens), narrower, under AdamW: the state a checkpoint must carry for a transformer
VIT = ROOT / "configs" / "mnist_vit.yaml"
VIT_SETS = ("distribution.world_size=2",)
CASES |= {"torch-vit-w2": ("torch", VIT_SETS), "tf-vit-w2": ("tf", VIT_SETS)}
CONFIGS = {"torch-vit-w2": VIT, "tf-vit-w2": VIT}  # the others: configs/mnist_mlp.yaml
SLOW = pytest.mark.slow
# The default suite covers each mechanism once per backend; the slow set (CI runs it) every case.
RESUME_CASES = [
    "torch-w3",
    "tf-mirrored-w2",
    pytest.param("tf-multi_worker-w2", marks=SLOW),
    pytest.param("torch-vit-w2", marks=SLOW),
    pytest.param("tf-vit-w2", marks=(SLOW, pytest.mark.sweep)),  # CI: the torch ViT resume
]
RESTART_CASES = [
    "torch-w3",
    pytest.param("tf-mirrored-w2", marks=SLOW),
    pytest.param("tf-multi_worker-w2", marks=SLOW),
]


def run(
    backend: str | None,
    out: Path,
    *sets: str,
    extra: tuple[str, ...] = (),
    config: Path | None = None,
) -> subprocess.CompletedProcess:
    config = config or MLP
    args = [
        "run",
        *(("--backend", backend) if backend else ()),
        "--config",
        str(config),
        "--out",
        str(out),
        *extra,
    ]
    for s in (*BASE, *sets):
        args += ["--set", s]
    return run_cli(*args, timeout=300)


def assert_same_run(a: Path, b: Path) -> None:
    wa, wb = load_weights(a / "weights_final.npz"), load_weights(b / "weights_final.npz")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert np.array_equal(wa[k], wb[k]), f"{k}: max |diff| {np.abs(wa[k] - wb[k]).max():.3g}"

    def rows(p: Path) -> list[dict]:
        return [
            {k: v for k, v in json.loads(line).items() if k != "samples_per_s"}
            for line in (p / "metrics.jsonl").read_text().splitlines()
        ]

    assert rows(a) == rows(b)
    assert (a / "shards.jsonl").read_text() == (b / "shards.jsonl").read_text()
    # TensorBoard shows every step once, as in the uninterrupted run (event files cut back too)
    ea, eb = (read_scalars(p / "tensorboard") for p in (a, b))
    ea.pop("train/samples_per_s")
    eb.pop("train/samples_per_s")
    assert ea == eb


class Uninterrupted(dict):
    """The uninterrupted run of a case, made the first time a test asks for it."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def __missing__(self, name: str) -> Path:
        backend, sets = CASES[name]
        proc = run(backend, self.base / name, *sets, config=CONFIGS.get(name, MLP))
        assert proc.returncode == 0, proc.stderr[-3000:]
        self[name] = self.base / name
        return self[name]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return Uninterrupted(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.parametrize("case", RESUME_CASES)
def test_killed_worker_then_resume_is_bit_identical(tmp_path, reference, case):
    backend, sets = CASES[case]
    out = tmp_path / "run"
    # rank 1 (tf mirrored: the only worker, 0) is SIGKILLed at step 25, after the step-20 checkpoint
    rank = 0 if "mirrored" in case or case == "tf-vit-w2" else 1
    config = CONFIGS.get(case, MLP)
    proc = run(backend, out, *sets, f"debug.exit_rank=[25, {rank}]", config=config)
    assert proc.returncode == 1 and "SIGKILL" in proc.stderr, proc.stderr[-2000:]
    assert checkpoint.complete_steps(out) == [10, 20]
    proc = run_cli("run", "--resume", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming after step 20" in proc.stdout
    assert_same_run(reference[case], out)
    summary = json.loads((out / "summary.json").read_text())
    assert [h["from_step"] for h in summary["resumed"]] == [20]
    assert summary["steps"] == 42 and summary["samples"] == 5200


@pytest.mark.parametrize("case", RESTART_CASES)
def test_max_restarts_restarts_by_itself(tmp_path, reference, case):
    backend, sets = CASES[case]
    out = tmp_path / "run"
    rank = 0 if "mirrored" in case else 1
    proc = run(backend, out, *sets, f"debug.exit_rank=[25, {rank}]", "distribution.max_restarts=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restart 1/1" in proc.stderr and "step-00000020" in proc.stderr
    assert_same_run(reference[case], out)
    assert json.loads((out / "summary.json").read_text())["attempt"] == 1


@SLOW
def test_restarts_run_out_and_the_failing_rank_is_named(tmp_path):
    # rank 1 dies at step 25 in every attempt: two restarts from the step-20 checkpoint, then the
    # run fails, naming the rank.
    out = tmp_path / "run"
    proc = run(
        "torch",
        out,
        "distribution.world_size=2",
        "debug.exit_rank=[25, 1]",
        "debug.exit_every_attempt=true",
        "distribution.max_restarts=2",
    )
    assert proc.returncode == 1
    assert proc.stderr.count("from " + str(out / "checkpoints" / "step-00000020")) == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "run failed after 2 restart(s): rank 1" in last and "SIGKILL" in last, last


@SLOW
@pytest.mark.serial  # a kill -9 from outside, timed against the run's progress
def test_external_kill_9_after_a_checkpoint(tmp_path, reference):
    # A real kill -9 from outside, at whatever step the run has reached once step 20 is saved.
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "dualtrain",
        "run",
        "--backend",
        "torch",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--out",
        str(out),
    ]
    for s in (*BASE, *CASES["torch-w3"][1]):
        args += ["--set", s]
    proc = subprocess.Popen(
        args, env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "step-00000020").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at step 20"
        time.sleep(0.005)
    pid = json.loads((out / "launch.json").read_text())["workers"][2]["pid"]
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the kill landed")
    assert proc.returncode == 1
    # the failure says the exact command that continues the run; it is the one used here
    command = err.split("continue it with: ", 1)[1].split(")")[0]
    assert command == f"dualtrain run --resume {out}", err[-2000:]
    resumed = run_cli(*shlex.split(command)[1:], timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(reference["torch-w3"], out)


@SLOW
def test_crash_during_checkpoint_write_resumes_from_the_previous_one(tmp_path, reference):
    out = tmp_path / "run"
    proc = run("torch", out, *CASES["torch-w3"][1], "debug.crash_in_checkpoint=30")
    assert proc.returncode == 1, proc.stderr[-2000:]
    # the half-written checkpoint of step 30 is not visible as one; 20 is the latest
    assert checkpoint.complete_steps(out) == [10, 20]
    assert any(p.name.startswith(".tmp-step-00000030") for p in (out / "checkpoints").iterdir())
    proc = run_cli("run", "--resume", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming after step 20" in proc.stdout
    assert_same_run(reference["torch-w3"], out)


@SLOW
def test_resume_on_another_world_size_continues_the_trajectory(tmp_path):
    # fp64, sharding exact: a world-2 run resumed at world 3 from step 20 stays on the world-2 run's
    # trajectory within the reference bound (the global batches do not depend on the world size).
    from dualtrain.parity.checks import Reference, check_reference_loss, check_reference_weights
    from dualtrain.records.record import read_run

    sets = ("distribution.world_size=2", "precision.dtype=fp64")
    full, part = tmp_path / "full", tmp_path / "part"
    assert run("torch", full, *sets).returncode == 0
    assert run("torch", part, *sets, "debug.exit_rank=[25, 1]").returncode == 1
    proc = run_cli("run", "--resume", str(part), "--world-size", "3", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = read_run(full), read_run(part)
    assert b.summary["world_size"] == 3 and b.summary["resumed"][0]["checkpoint_world_size"] == 2
    for check in (check_reference_loss(Reference(a, b)), check_reference_weights(Reference(a, b))):
        assert check.passed, check.detail
    assert {r["replica"] for r in b.shards if r["step"] > 20} == {0, 1, 2}


@SLOW
@pytest.mark.serial  # a TF_CONFIG cluster of processes killed and restarted
def test_a_restarted_tf_config_cluster_resumes_by_itself(tmp_path, reference):
    # What a Kubernetes TFJob with restartPolicy OnFailure does (examples/kubernetes/tfjob.yaml):
    # every task runs `dualtrain run` with the same --out on a shared volume; one dies, the others
    # fail on the lost peer; the operator starts every task again with the same command, and they
    # continue from the latest complete checkpoint by themselves.
    from dualtrain.launch.local import free_ports

    out = tmp_path / "shared" / "run"
    _, sets = CASES["tf-multi_worker-w2"]
    args = [
        sys.executable,
        "-m",
        "dualtrain",
        "run",
        "--backend",
        "tf",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--out",
        str(out),
    ]
    # one process per task, 1 thread each: as the local multi_worker reference run has
    for s in (*BASE, *sets, "distribution.threads_per_worker=1", "debug.exit_rank=[25, 1]"):
        args += ["--set", s]

    def cluster() -> list[subprocess.CompletedProcess]:
        ports = free_ports(2)
        procs = []
        for task in range(2):
            env = cli_env(
                {
                    "TF_CONFIG": json.dumps(
                        {
                            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                            "task": {"type": "worker", "index": task},
                        }
                    )
                }
            )
            procs.append(
                subprocess.Popen(
                    args,
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        done = [p.communicate(timeout=300) for p in procs]
        return [
            subprocess.CompletedProcess(p.args, p.returncode, o, e)
            for p, (o, e) in zip(procs, done, strict=True)
        ]

    first = cluster()  # task 1 SIGKILLs itself at step 25, after the step-20 checkpoint
    assert [p.returncode for p in first] == [1, -signal.SIGKILL], first[0].stderr[-3000:]
    assert "tf rank 0 lost its peer rank 1 (127.0.0.1)" in first[0].stderr
    assert checkpoint.complete_steps(out) == [10, 20] and not (out / "summary.json").exists()
    again = cluster()  # the restart: the same command lines
    assert [p.returncode for p in again] == [0, 0], (
        again[0].stderr[-3000:] + again[1].stderr[-3000:]
    )
    assert f"continuing {out} from {out / 'checkpoints' / 'step-00000020'}" in again[0].stdout
    assert_same_run(reference["tf-multi_worker-w2"], out)
    assert [h["from_step"] for h in json.loads((out / "summary.json").read_text())["resumed"]] == [
        20
    ]
