"""Cluster launchers through the real CLI (``run --dry-run``): Slurm's variables map to ranks and
addresses, the batch script is never a replica, torchrun and TF_CONFIG win, the Kubeflow operators'
environments give the right ranks (the examples' command lines: test_cluster_examples_cli.py).
(The same rules in this process, dualtrain/launch/cluster.py and the backends' launch.detect:
tests/launch/test_cluster_env.py.)

No training: the CLI runs with ``--dry-run --json`` (a subprocess, as a user or a pod would start
it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit.cli import ROOT
from tests.integration.dry_runs import CONFIG, batch_script_env, clean_env, dry_run
from tests.launch.test_cluster_env import slurm_step

# ------------------------------------------------------------------------------------------------
# Through the real CLI: dualtrain run --dry-run --json


@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_slurm_two_node_job_through_cli(backend, tmp_path):
    out = tmp_path / "run"
    plans = [
        dry_run(
            backend, slurm_step(p, nodename=f"node0{p + 1}"), "--world-size", "4", "--out", str(out)
        )
        for p in (0, 1)
    ]
    for p, plan in enumerate(plans):
        assert plan["launcher"] == "slurm" and plan["role"] == "worker"
        assert (plan["rank"], plan["world_size"], plan["spec_world_size"]) == (p, 2, 4)
        assert plan["run_dir"] == str(out)
        assert plan["run_dir_action"] == ("create" if p == 0 else None)
        if backend == "torch":
            assert (plan["master_addr"], plan["master_port"]) == ("node01", 19123)
            assert plan["env"]["RANK"] == str(p) and plan["env"]["MASTER_ADDR"] == "node01"
        else:
            assert plan["tf_cluster"] == {"worker": ["node01:19123", "node02:19123"]}
            assert plan["tf_task"] == f"worker:{p}" and plan["tf_strategy"] == "multi_worker"
            assert json.loads(plan["env"]["TF_CONFIG"])["task"]["index"] == p
    assert not out.exists()  # a dry run writes nothing


def test_batch_script_is_not_a_replica(tmp_path):
    plan = dry_run("torch", batch_script_env(), "--out", str(tmp_path / "r"))
    assert (plan["launcher"], plan["role"], plan["rank"], plan["processes"]) == (
        "local",
        "launcher",
        None,
        2,
    )
    assert plan["env"] == {}


def test_torchrun_wins_over_slurm_through_cli(tmp_path):
    env = {
        **slurm_step(0, nodename="node01"),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "77",
    }
    plan = dry_run("torch", env, "--out", str(tmp_path / "r"))
    assert (plan["launcher"], plan["rank"], plan["master_addr"], plan["master_port"]) == (
        "torchrun",
        1,
        "10.1.2.3",
        29500,
    )
    assert plan["env"] == {}  # torchrun's variables are used as they are


def test_pytorchjob_env_through_cli(tmp_path):
    # What the training operator sets (pkg/controller.v1/pytorch/envvar.go, master.go) for a job
    # "mnist" with one Master and one Worker, nprocPerNode "1".
    base = {
        "PYTHONUNBUFFERED": "0",
        "MASTER_ADDR": "mnist-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NNODES": "2",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    for pod, rank in (("master-0", 0), ("worker-0", 1)):
        env = {**base, "RANK": str(rank), "PET_NODE_RANK": str(rank)}
        plan = dry_run("torch", env, "--out", str(tmp_path / "r"))
        assert (plan["launcher"], plan["rank"], plan["world_size"]) == (
            "kubeflow-pytorchjob",
            rank,
            2,
        ), pod
        assert (plan["master_addr"], plan["master_port"]) == ("mnist-master-0", 23456)


@pytest.mark.parametrize("layout", ["chief+worker", "worker-only"])
def test_tfjob_tf_config_through_cli(layout, tmp_path):
    # The operator's TF_CONFIG (pkg/controller.v1/tensorflow/tensorflow.go, genTFConfigJSONStr).
    cl = (
        {"chief": ["mnist-chief-0.ns.svc:2222"], "worker": ["mnist-worker-0.ns.svc:2222"]}
        if layout == "chief+worker"
        else {"worker": ["mnist-worker-0.ns.svc:2222", "mnist-worker-1.ns.svc:2222"]}
    )
    tasks = (
        [("chief", 0), ("worker", 0)]
        if layout == "chief+worker"
        else [("worker", 0), ("worker", 1)]
    )
    for rank, (ttype, index) in enumerate(tasks):
        tf_config = {"cluster": cl, "task": {"type": ttype, "index": index}, "environment": "cloud"}
        plan = dry_run("tf", {"TF_CONFIG": json.dumps(tf_config)}, "--out", str(tmp_path / "r"))
        assert (plan["launcher"], plan["rank"], plan["world_size"]) == ("kubeflow-tfjob", rank, 2)
        assert plan["tf_cluster"] == cl and plan["tf_task"] == f"{ttype}:{index}"
        assert plan["tf_strategy"] == "multi_worker"
        assert plan["run_dir_action"] == ("create" if rank == 0 else None)


def test_invalid_slurm_env_through_cli(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dualtrain",
            "run",
            "--backend",
            "torch",
            "--config",
            CONFIG,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(slurm_step(3)),
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "dualtrain: error: SLURM_PROCID must be below the step's task count "
        "SLURM_STEP_NUM_TASKS=2. Received: SLURM_PROCID=3"
    ]
    assert "Traceback" not in proc.stderr and not out.exists()


def test_dry_run_imports_no_framework():
    # The CLI process never imports a framework, a dry run included (docs/architecture.md).
    code = (
        "import sys\nfrom dualtrain.cli import main\n"
        "for b in ('torch', 'tf'):\n"
        "    try:\n"
        "        main(['run', '--backend', b, '--config', sys.argv[1], '--dry-run', '--json'])\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, exc.code\n"
        "loaded = {'torch', 'tensorflow', 'keras'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, CONFIG],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(slurm_step(1, nodename="node02")),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    plans = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(p["backend"], p["launcher"], p["rank"]) for p in plans] == [
        ("torch", "slurm", 1),
        ("tf", "slurm", 1),
    ]
