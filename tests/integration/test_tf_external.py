"""Inside an external TF_CONFIG cluster (chief + worker), `dualtrain run` is one worker of it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dualtrain.core.plan import ShardPlan
from dualtrain.launch.local import free_ports
from dualtrain.records.record import read_run
from dualtrain.spec import from_dict
from testkit.tf_runs import ROOT, python_env, small_spec, write_spec


@pytest.mark.slow  # default-suite time: runs in CI's slow part (docs/testing.md)
def test_external_tf_config_cluster_runs_multi_worker(tmp_path):
    # The spec says mirrored and world_size 3: the 2-task cluster decides (multi_worker, 2
    # replicas).
    cfg = write_spec(tmp_path / "spec.yaml", small_spec(distribution={"world_size": 3}))
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = []
    for task, out in ((("chief", 0), tmp_path / "chief"), (("worker", 0), tmp_path / "other")):
        env = python_env()
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dualtrain",
                    "run",
                    "--backend",
                    "tf",
                    "--config",
                    str(cfg),
                    "--out",
                    str(out),
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, f"{out}\n{err}"
    assert "running tf.strategy=multi_worker" in results[0][0]
    assert not (tmp_path / "other").exists()  # only the chief writes a run directory
    rec = read_run(tmp_path / "chief")
    assert rec.summary["world_size"] == 2 and rec.summary["tf_strategy"] == "multi_worker"
    assert rec.summary["tf_processes"] == 2
    spec = from_dict(yaml.safe_load((tmp_path / "chief" / "spec.yaml").read_text()))
    assert spec.tf.strategy.value == "multi_worker" and spec.distribution.world_size == 2
    plan = ShardPlan.from_spec(spec, 64)
    got = [(r["digest"], r["count"]) for r in rec.shards]
    assert got == [dc for step in plan.digests(0) for dc in step]
