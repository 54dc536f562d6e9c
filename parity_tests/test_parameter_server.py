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


# ---- distribution.strategy: parameter_server (torch; tf's is not built yet) ---------------------

PS = "distribution.strategy=parameter_server"


def _final(run):
    from dualtrain.core.weights import load_weights

    return load_weights(run / "weights_final.npz")


def _train(run) -> list[dict]:
    return [
        r
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]


def _max_diff(a, b) -> float:
    import numpy as np

    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


@pytest.mark.slow
def test_the_parameter_server_strategy_is_the_all_reduce_run_in_fp64(runs):
    """The fp64 pair of the mode against the all-reduce run: world 3 (uneven shards), the same
    weights within 1e-10, the same loss at every step; the server's process is one of the run's."""
    all_reduce = runs("torch", *SETS, config=CNN)
    server = runs("torch", *SETS, PS, config=CNN)
    assert _max_diff(_final(server), _final(all_reduce)) <= BOUND
    a, b = _train(all_reduce), _train(server)
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b, strict=True)) <= BOUND
    launched = json.loads((server / "launch.json").read_text())["workers"]
    assert len(launched) == 4  # 3 replicas and the server
    assert json.loads((server / "summary.json").read_text())["parameter_server"]


@pytest.mark.slow
def test_torch_through_a_server_and_tf_all_reduced_are_one_experiment(runs):
    """Across backends: the fp64 pair of torch's parameter-server run and TF's all-reduce
    (multi_worker) run of the same spec passes the reference checks compare makes."""
    from dualtrain.parity.checks import Reference
    from dualtrain.records.record import read_run

    from .conftest import assert_reference_agrees

    server = runs("torch", *SETS, PS, config=CNN)
    tf_all_reduce = runs("tf", *SETS, config=CNN)
    assert_reference_agrees(Reference(read_run(server), read_run(tf_all_reduce)))


@pytest.mark.slow
def test_a_server_that_averages_the_replicas_means_fails_the_pair(runs):
    """The check can fail: the mean of the replicas' own means on the server's path (22, 21, 21
    samples) moves the weights far beyond the bound."""
    from tools.mutants import hook

    all_reduce = runs("torch", *SETS, config=CNN)
    planted = runs("torch", *SETS, PS, config=CNN, env=hook("ps_mean_of_means", backend="torch"))
    assert _max_diff(_final(planted), _final(all_reduce)) > 1e3 * BOUND


@pytest.mark.slow
def test_fp16_skips_on_the_server_as_in_the_all_reduce_run(runs):
    """fp16 at world 2 (a sum of two terms: the same in any order): the server's loss-scale
    decisions, skipped steps (an inf planted in one replica's gradient) and weights are bit for bit
    the all-reduce run's."""
    import numpy as np

    sets = (
        "precision.dtype=fp16",
        "distribution.world_size=2",
        "train.max_steps=12",
        "train.epochs=null",
        "data.test_limit=500",
        "debug.nonfinite_grad=[[3, 1], [7, 0]]",
        "precision.loss_scale.growth_interval=2",
    )
    all_reduce = runs("torch", *sets)
    server = runs("torch", *sets, PS)
    a, b = _train(all_reduce), _train(server)
    assert [r["skipped"] for r in b] == [r["skipped"] for r in a]
    assert sum(r["skipped"] for r in b) == 2
    assert [r["loss_scale"] for r in b] == [r["loss_scale"] for r in a]
    assert [r["loss"] for r in b] == [r["loss"] for r in a]
    fa, fb = _final(all_reduce), _final(server)
    assert all(np.array_equal(fa[k], fb[k]) for k in fa)
