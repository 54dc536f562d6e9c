"""distribution.bind_cores on a real run: each local worker of a world-2 run on its own core (the
chief's recorded in summary.json), every usable core with bind_cores false."""

from __future__ import annotations

import json
import os

import pytest

from testkit.cli import run_cli

USABLE = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable cores")
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_world_two_run_binds_each_worker_to_a_core_of_its_own(backend, tmp_path):
    common = ["--config", "configs/mnist_mlp.yaml", "--world-size", "2", "--backend", backend]
    sets = ["train.max_steps=2", "train.epochs=null", "data.test_limit=50",
            "logging.tensorboard=false", "tf.strategy=multi_worker"]  # fmt: skip
    cores = {}
    for bind in ("true", "false"):
        out = tmp_path / bind
        args = [a for s in [*sets, f"distribution.bind_cores={bind}"] for a in ("--set", s)]
        proc = run_cli("run", *common, *args, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        cores[bind] = json.loads((out / "summary.json").read_text())["cpu_affinity"]
    threads = len(USABLE) // 2
    assert cores == {"true": USABLE[:threads], "false": USABLE}
