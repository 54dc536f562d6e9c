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

from testkit.cli import ROOT, cli_env

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


# ---- distribution.strategy: parameter_server -----------------------------------------------------

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
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_the_parameter_server_strategy_is_the_all_reduce_run_in_fp64(runs, backend):
    """The fp64 pair of the mode against the all-reduce run (tf: multi_worker): world 3 (uneven
    shards), the same weights within 1e-10, the same loss at every step; the server processes are
    the run's (torch: one parameter server; tf: 3 worker tasks and one parameter server)."""
    all_reduce = runs(backend, *SETS, config=CNN)
    server = runs(backend, *SETS, PS, config=CNN)
    assert _max_diff(_final(server), _final(all_reduce)) <= BOUND
    a, b = _train(all_reduce), _train(server)
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b, strict=True)) <= BOUND
    launched = json.loads((server / "launch.json").read_text())["workers"]
    roles = [w.get("role") for w in launched]
    assert roles[-1] == "parameter server"
    assert len(roles) == (4 if backend == "torch" else 5)
    assert json.loads((server / "summary.json").read_text())["parameter_server"]


@pytest.mark.slow
def test_both_backends_through_their_servers_are_one_experiment(runs):
    """Across backends: the fp64 pair of torch's and TF's parameter-server runs, and of torch's
    server run and TF's all-reduce run, pass the reference checks compare makes."""
    from dualtrain.parity.checks import Reference
    from dualtrain.records.record import read_run
    from testkit.parity_runs import assert_reference_agrees

    torch_ps = read_run(runs("torch", *SETS, PS, config=CNN))
    assert_reference_agrees(Reference(torch_ps, read_run(runs("tf", *SETS, PS, config=CNN))))
    assert_reference_agrees(Reference(torch_ps, read_run(runs("tf", *SETS, config=CNN))))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_server_that_averages_the_replicas_means_fails_the_pair(runs, backend):
    """The check can fail: the mean of the replicas' own means on the server's path (22, 21, 21
    samples) moves the weights far beyond the bound, on either backend."""
    from tools.mutants import hook

    all_reduce = runs(backend, *SETS, config=CNN)
    planted = runs(backend, *SETS, PS, config=CNN, env=hook("ps_mean_of_means", backend=backend))
    assert _max_diff(_final(planted), _final(all_reduce)) > 1e3 * BOUND


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_fp16_skips_on_the_server_as_in_the_all_reduce_run(runs, backend):
    """fp16 at world 2 (a sum of two terms: the same in any order): the server's loss-scale
    decisions, skipped steps (an inf planted in one replica's gradient) and weights are bit for bit
    the all-reduce run's (tf: multi_worker; its worker tasks run the kernels with the threads an
    all-reduce worker has, or the float32 sums part in the last bit)."""
    import numpy as np

    sets = (
        "precision.dtype=fp16",
        "distribution.world_size=2",
        "tf.strategy=multi_worker",
        "train.max_steps=12",
        "train.epochs=null",
        "data.test_limit=500",
        "debug.nonfinite_grad=[[3, 1], [7, 0]]",
        "precision.loss_scale.growth_interval=2",
    )
    all_reduce = runs(backend, *sets)
    server = runs(backend, *sets, PS)
    a, b = _train(all_reduce), _train(server)
    assert [r["skipped"] for r in b] == [r["skipped"] for r in a]
    assert sum(r["skipped"] for r in b) == 2
    assert [r["loss_scale"] for r in b] == [r["loss_scale"] for r in a]
    assert [r["loss"] for r in b] == [r["loss"] for r in a]
    fa, fb = _final(all_reduce), _final(server)
    assert all(np.array_equal(fa[k], fb[k]) for k in fa)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_killed_parameter_server_run_resumes_bit_for_bit(tmp_path, backend):
    """Checkpoints read the optimizer state where it lives (the server) and a resume puts it
    back there: killed at step 8, resumed from step 5's checkpoint, the run ends at the
    uninterrupted run's weights bit for bit (fp16 with a growing loss scale, adam)."""
    import numpy as np

    from testkit.cli import run_cli

    sets = [
        "distribution.strategy=parameter_server",
        "train.max_steps=12",
        "train.epochs=null",
        "data.test_limit=300",
        "train.checkpoint_every=5",
        "precision.dtype=fp16",
        "precision.loss_scale.growth_interval=3",
        "optimizer.name=adam",
        "optimizer.lr=0.001",
    ]
    args = [a for s in sets for a in ("--set", s)]
    mlp = str(ROOT / "configs" / "mnist_mlp.yaml")
    full, cut = tmp_path / "full", tmp_path / "cut"
    proc = run_cli("run", "--backend", backend, "--config", mlp, *args, "--out", str(full))
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli(
        "run", "--backend", backend, "--config", mlp, *args,
        "--set", "debug.exit_rank=[8, 0]", "--out", str(cut),
    )  # fmt: skip
    assert proc.returncode == 1 and "killed by SIGKILL" in proc.stderr
    proc = run_cli("run", "--backend", backend, "--resume", str(cut))
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = _final(full), _final(cut)
    assert all(np.array_equal(a[k], b[k]) for k in a)
