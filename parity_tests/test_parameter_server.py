"""The parameter-server spike (issue 21, docs/strategies.md): a synchronous parameter-server job,
run on a localhost cluster of real processes with each framework's own parameter-server API
(TF: ParameterServerStrategy + ClusterCoordinator, Keras 3 variables on the parameter servers;
torch: torch.distributed.rpc, the batch-updating parameter server), replays dualtrain's fp64
all-reduce run step for step and must end at the same weights within the fp64 pair's 1e-10. The
semantic defect parameter-server scripts most often carry (each replica's own mean, averaged on the
server) must fail it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli_env

CNN = str(ROOT / "configs" / "mnist_cnn.yaml")
SETS = (
    "precision.dtype=fp64",
    "distribution.world_size=3",  # 64 over 3 replicas: 22, 21, 21 (uneven, for the plant)
    "tf.strategy=multi_worker",
    "optimizer.name=sgd",
    "optimizer.lr=0.05",
    "optimizer.momentum=0.9",
    "train.max_steps=12",
    "train.epochs=null",
    "data.test_limit=500",
)
BOUND = 1e-10  # the fp64 reference pair's bound (docs/parity.md)


def _spike(backend: str, run_dir, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.ps_spike", backend, str(run_dir), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=cli_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_synchronous_parameter_server_is_the_all_reduce_run(runs, backend):
    run = runs(backend, *SETS, config=CNN)
    extra = ("--ps", "2") if backend == "tf" else ()
    got = _spike(backend, run, *extra)
    assert got["world_size"] == 3 and got["steps"] == 12
    assert got["max_abs_diff_vs_allreduce"] <= BOUND, got
    planted = _spike(backend, run, "--plant", "mean_of_means", *extra)
    assert planted["max_abs_diff_vs_allreduce"] > 1e3 * BOUND, planted
