"""Cluster launchers: which one started this process, and what it means (framework-free).

``dualtrain run`` is either the launcher of its own local workers, or one replica of a run that
something else launched. This module reads that something from the environment:

* **torchrun** (and anything that sets torchrun's variables: the Kubeflow PyTorchJob operator, a
  hand-written script): ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
  [, ``LOCAL_RANK``].
* **TF_CONFIG** (Kubeflow TFJob, a hand-written cluster spec): parsed by the tf backend's launch
  module; :func:`tf_config_launcher` describes it.
* **Slurm**: a task started by ``srun`` (one task per replica) *without* torchrun. Slurm's variables
  are turned into torchrun's (torch) or into a ``TF_CONFIG`` (tf), which :func:`apply` exports into
  ``os.environ`` before the worker starts, so the workers see one interface whoever launched them.

Slurm's variables are read by :mod:`dualtrain.launch.slurm`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dualtrain.errors import UserError

TORCH_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_SWITCH = "DUALTRAIN_SLURM"
"""``0``/``off``/``false``/``no``: never treat an srun task as a replica (launch locally
instead)."""
TF_PORT_BASE = "DUALTRAIN_TF_PORT_BASE"
"""Under Slurm, the first TF worker port on every node (default: the torch ``MASTER_PORT`` rule)."""
#: Lightning's MASTER_PORT rule: 15000 + the last four digits of SLURM_JOB_ID (12910 without one).
PORT_OFFSET, PORT_NO_JOB = 15000, 12910
#: Slurm's reserved step ids (batch script, extern, interactive, pending, ...) are 0xfffffff0 and
#: up.
FIRST_RESERVED_STEP = 0xFFFFFFF0
#: Lightning's interactive-job rule: a job named like this is someone's shell, not a training step.
INTERACTIVE_JOB_NAMES = ("bash", "interactive")


@dataclass(frozen=True)
class Launcher:
    """An external launcher and this process's place in it."""

    kind: str
    """torchrun | kubeflow-pytorchjob | torch-env | tf-config | kubeflow-tfjob | slurm"""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    tf_cluster: dict[str, list[str]] | None = None
    tf_task: str | None = None
    """``type:index`` of this task in ``tf_cluster``."""
    host: str | None = None
    """This task's node (Slurm) or address (TF_CONFIG), when known."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables dualtrain exports into os.environ before the worker starts (Slurm only)."""
    line: str = ""
    """The one line ``dualtrain run`` says on stdout about it."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "tf_cluster": self.tf_cluster,
            "tf_task": self.tf_task,
            "host": self.host,
            "env": dict(self.env),
            "line": self.line,
        }


def apply(launcher: Launcher) -> None:
    """Make this process one replica of ``launcher``: export its variables (the Slurm mapping) into
    os.environ, where the torch worker (``worker.dist_env``) and the tf worker (``plan_process``)
    read them, and say which launcher it is. Called once, by runs.start_run."""
    os.environ.update(launcher.env)
    print(f"dualtrain: {launcher.line}", flush=True)


# ---------------------------------------------------------------------------------------------
# torchrun's variables (torchrun, the Kubeflow PyTorchJob operator, a script)


def env_port(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise UserError(f"{name} must be a port number in 1..65535. Received: {name}={value!r}")
    return int(value)


def torch_env_launcher(env: Mapping[str, str] | None = None) -> Launcher | None:
    """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set: who set them, and this process's rank."""
    env = os.environ if env is None else env
    if not all(k in env for k in TORCH_KEYS):
        return None
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in env:
            value = env[name].strip()
            if not value.isdigit():
                raise UserError(
                    f"{name} must be a non-negative integer. Received: {name}={value!r}"
                )
            values[name] = int(value)
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world < 1 or rank >= world:
        raise UserError(f"RANK must be below WORLD_SIZE={world}. Received: RANK={rank}")
    port, addr = env_port(env, "MASTER_PORT"), env["MASTER_ADDR"].strip()
    if "TORCHELASTIC_RUN_ID" in env:
        kind, who = "torchrun", "torchrun"
    elif any(k in env for k in ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")) or (
        "KUBERNETES_SERVICE_HOST" in env and addr.endswith("-master-0")
    ):
        # The training operator sets PET_* (v1.7+) and MASTER_ADDR=<job>-master-0 (its Service).
        kind, who = "kubeflow-pytorchjob", "Kubeflow PyTorchJob"
        nproc = env.get("PET_NPROC_PER_NODE", "").strip()
        if nproc.isdigit() and int(nproc) > 1:
            # The operator's WORLD_SIZE then counts processes, but RANK is the pod's index: it is
            # torchrun's input (PET_*), not a process rank.
            raise UserError(
                f"this PyTorchJob sets nprocPerNode {nproc}: its pods must start "
                f"torchrun (which reads PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE), "
                f'not dualtrain directly; or set nprocPerNode: "1". Received: '
                f"PET_NPROC_PER_NODE={nproc}"
            )
    else:
        kind, who = "torch-env", "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment:"
    local = values.get("LOCAL_RANK", rank)
    line = f"{who} rank {rank} of {world}, MASTER_ADDR {addr}:{port}"
    return Launcher(
        kind=kind,
        rank=rank,
        world_size=world,
        local_rank=local,
        local_world_size=values.get("LOCAL_WORLD_SIZE"),
        master_addr=addr,
        master_port=port,
        line=line,
    )


@dataclass(frozen=True)
class TFTask:
    """This process's task in a TF_CONFIG cluster (the tf backend's ``parse_tf_config``): its
    rank (a "chief" task is rank 0, then the workers by index), the cluster's size, its index
    among its own type, and whether the cluster names a chief."""

    rank: int
    world_size: int
    task_index: int
    chief: bool


def tf_config_launcher(info: TFTask, cfg: Mapping[str, Any]) -> Launcher:
    """A parsed TF_CONFIG (``info`` from the tf backend's ``parse_tf_config``) as a Launcher."""
    cluster = {k: list(v) for k, v in cfg["cluster"].items()}
    ttype, index = str(cfg["task"]["type"]), int(cfg["task"]["index"])
    members = cluster.get("chief", []) + cluster.get("worker", [])
    own = cluster.get(ttype, [None] * (index + 1))[index] if ttype in cluster else None
    # The Kubeflow TFJob operator adds "environment": "cloud" (pkg/controller.v1/tensorflow).
    kubeflow = cfg.get("environment") == "cloud"
    kind = "kubeflow-tfjob" if kubeflow else "tf-config"
    who = "Kubeflow TFJob" if kubeflow else "TF_CONFIG"
    return Launcher(
        kind=kind,
        rank=info.rank,
        world_size=info.world_size,
        local_rank=0,
        tf_cluster=cluster,
        tf_task=f"{ttype}:{index}",
        host=own,
        line=f"{who} task {ttype}:{index} = worker {info.rank} of "
        f"{info.world_size} at {own} (chief {members[0] if members else '?'})",
    )
