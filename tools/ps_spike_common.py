"""What both halves of the parameter-server spike share (tools/ps_spike.py drives the TF half and
tools/ps_spike_torch.py the torch half): free ports, the finished run's replay inputs, the loss
normaliser (and the planted mean-of-means defect), and the report against the run's weights."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np

from dualtrain.core.data import open_data
from dualtrain.core.plan import ShardPlan
from dualtrain.spec import load_spec


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def load_replay(run_dir: Path):
    spec = load_spec(run_dir / "spec.yaml")
    if spec.optimizer.name.value != "sgd" or spec.precision.dtype.value != "fp64":
        raise SystemExit("the spike replays fp64 sgd runs only")
    data = open_data(spec, run_dir)
    plan = ShardPlan.from_spec(spec, data.size("train"))
    lrs = [
        r["lr"]
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    steps = []
    for k in range(len(lrs)):
        epoch, step = divmod(k, plan.steps_per_epoch)
        steps.append(plan.step_ids(epoch, step))
    return spec, data, steps, lrs


def normaliser(ids_per_replica: list[np.ndarray], replica: int, plant: str | None) -> float:
    """What a replica divides its summed loss by: the global step's sample count (dualtrain's
    rule), or with the planted defect its own count."""
    if plant == "mean_of_means":
        return float(len(ids_per_replica[replica]))
    return float(sum(len(i) for i in ids_per_replica))


def server_factor(world: int, plant: str | None) -> float:
    """What the server multiplies the summed gradient by: 1, or 1/W for the planted average."""
    return 1.0 / world if plant == "mean_of_means" else 1.0


def print_report(backend: str, run_dir: Path, final: dict, seconds: float, n_steps: int) -> None:
    ref = dict(np.load(run_dir / "weights_final.npz"))
    worst = max(float(np.max(np.abs(final[k] - ref[k]))) for k in ref)
    scale = max(float(np.max(np.abs(ref[k]))) for k in ref)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        json.dumps(
            {
                "backend": backend,
                "world_size": summary["world_size"],
                "steps": n_steps,
                "max_abs_diff_vs_allreduce": worst,
                "max_rel_diff_vs_allreduce": worst / scale,
                "ps_seconds_per_step": seconds / n_steps,
                "allreduce_seconds_per_step": summary["train_wall_s"] / summary["steps"],
            },
            indent=1,
        )
    )


# ---- TF: ParameterServerStrategy + ClusterCoordinator --------------------------------------------
