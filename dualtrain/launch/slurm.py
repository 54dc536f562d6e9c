"""Slurm: a task started by ``srun`` (one task per replica, without torchrun) as one replica of
a run; its variables turned into torchrun's (torch) or a ``TF_CONFIG`` (tf), which
:func:`dualtrain.launch.cluster.apply` exports (framework-free).

Slurm detection follows PyTorch Lightning's ``SLURMEnvironment`` (``SLURM_NTASKS`` present and the
job not named ``bash``/``interactive``; ``MASTER_ADDR`` = the first node, ``MASTER_PORT`` =
``MASTER_PORT`` or 15000 + the last four digits of ``SLURM_JOB_ID``) and TensorFlow's
``SlurmClusterResolver`` (the step's node list and tasks per node, one port per task on a node:
base + ``SLURM_LOCALID``), with three guards Lightning leaves out:

* only a job **step** counts: ``SLURM_STEP_ID`` (or the older ``SLURM_STEPID``) must be a step
  number. Slurm sets it for every ``srun`` task and not for the batch script itself (which also has
  ``SLURM_PROCID=0`` and ``SLURM_NTASKS=N`` but runs once: ``env_array_for_batch_job`` in Slurm's
  ``src/common/env.c`` sets no step variables), nor for the ``extern``/``batch``/``interactive``
  pseudo-steps (their ids are the reserved values 0xfffffff0 and up);
* a step with **one** task is not a cluster: dualtrain launches the spec's ``world_size`` workers
  itself inside it (``srun -n1 dualtrain run --world-size 4`` on one node);
* an existing launcher wins: with torchrun's four variables or a ``TF_CONFIG`` set, Slurm is not
  consulted (``srun torchrun ...`` is torchrun's rendezvous; its ranks are torchrun's).

``DUALTRAIN_SLURM=0`` turns Slurm detection off (dualtrain then launches locally in every task).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dualtrain.errors import UserError
from dualtrain.launch.cluster import (
    FIRST_RESERVED_STEP,
    INTERACTIVE_JOB_NAMES,
    PORT_NO_JOB,
    PORT_OFFSET,
    SLURM_SWITCH,
    TF_PORT_BASE,
    TORCH_KEYS,
    Launcher,
    env_port,
)

# ---------------------------------------------------------------------------------------------
# Slurm's compact lists


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5.

    Order is kept and nothing is deduplicated (the order is the order of the step's nodes). A range
    keeps the zero padding of its lower bound (``n[08-10]`` -> n08 n09 n10); several bracket groups
    in one name expand as a product, the first outermost (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2);
    whitespace separates names too. Raises ValueError on anything else."""
    hosts: list[str] = []
    for name in _split_top(text):
        parts = re.split(r"(\[[^\[\]]*\])", name)
        if any(c in part for part in parts[::2] for c in "[]"):
            raise ValueError(f"unbalanced brackets in {name!r}")
        choices = [
            [part] if i % 2 == 0 else _expand_ranges(part[1:-1], name)
            for i, part in enumerate(parts)
            if part
        ]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    if not hosts:
        raise ValueError("no host names")
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at commas and whitespace outside brackets."""
    names, depth, cur = [], 0, ""
    for c in text:
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested brackets")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        if depth == 0 and (c == "," or c.isspace()):
            if cur:
                names.append(cur)
            elif c == ",":
                raise ValueError("empty host name")
            cur = ""
            continue
        cur += c
    if depth:
        raise ValueError("'[' without ']'")
    if cur:
        names.append(cur)
    elif text.strip().endswith(","):
        raise ValueError("empty host name")
    return names


def _expand_ranges(body: str, name: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in {name!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in {name!r}")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's tasks-per-node list: ``2(x3),1`` -> [2, 2, 2, 1]. Raises ValueError."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"bad item {part!r}")
        reps = int(m.group(2) or 1)
        if reps < 1:
            raise ValueError(f"bad repeat count in {part!r}")
        counts.extend([int(m.group(1))] * reps)
    return counts


# ---------------------------------------------------------------------------------------------
# Slurm


@dataclass(frozen=True)
class SlurmTask:
    """One srun task, with the step laid out node by node (block distribution)."""

    rank: int
    world_size: int
    local_rank: int
    hosts: list[str]
    tasks_per_node: list[int]
    node: int
    """Index of this task's node in ``hosts``."""
    job_id: str | None

    @property
    def host(self) -> str:
        return self.hosts[self.node]

    def task_hosts(self) -> list[tuple[str, int]]:
        """(node, local id) of every task, in rank order."""
        return [
            (h, i) for h, n in zip(self.hosts, self.tasks_per_node, strict=True) for i in range(n)
        ]


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        if env.get(name, "").strip():
            return name, env[name].strip()
    return None


def _int_var(env: Mapping[str, str], *names: str, minimum: int = 0) -> tuple[str, int]:
    found = _first(env, *names)
    if found is None:
        raise UserError(
            f"{names[0]} is not set, which an srun task needs (dualtrain maps Slurm's "
            f"variables to its ranks; DUALTRAIN_SLURM=0 turns that off). Received: "
            f"{', '.join(names)} unset"
        )
    name, value = found
    if not re.fullmatch(r"\d+", value) or int(value) < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}")
    return name, int(value)


def _step_id(env: Mapping[str, str]) -> int | None:
    """The srun step this process belongs to; None for the batch script and the pseudo-steps."""
    found = _first(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if found is None or not found[1].isdigit() or int(found[1]) >= FIRST_RESERVED_STEP:
        return None
    return int(found[1])


def slurm_task(env: Mapping[str, str] | None = None) -> SlurmTask | None:
    """This process as a task of a multi-task srun step, or None when it is not one (not under
    Slurm, the batch script, an interactive job, a one-task step, DUALTRAIN_SLURM=0). Raises
    UserError, naming the variable and its value, when the step's variables are inconsistent."""
    env = os.environ if env is None else env
    if env.get(SLURM_SWITCH, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    if "SLURM_PROCID" not in env or _step_id(env) is None:
        return None
    if env.get("SLURM_JOB_NAME", "") in INTERACTIVE_JOB_NAMES:
        return None
    ntasks_var, ntasks = _int_var(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", minimum=1)
    if ntasks == 1:
        return None
    procid_var, procid = _int_var(env, "SLURM_PROCID")
    if procid >= ntasks:
        raise UserError(
            f"{procid_var} must be below the step's task count {ntasks_var}={ntasks}. "
            f"Received: {procid_var}={procid}"
        )
    local_var, local = _int_var(env, "SLURM_LOCALID")
    hosts_var, hosts_text = _first(
        env, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"
    ) or ("SLURM_STEP_NODELIST", "")
    try:
        hosts = expand_hostlist(hosts_text)
    except ValueError as exc:
        raise UserError(
            f"{hosts_var} is not a Slurm hostlist ({exc}). Received: {hosts_var}={hosts_text!r}"
        ) from None
    tpn_var, tpn_text = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") or (
        "SLURM_STEP_TASKS_PER_NODE",
        "",
    )
    try:
        tasks = expand_tasks_per_node(tpn_text)
    except ValueError as exc:
        raise UserError(
            f"{tpn_var} is not a Slurm tasks-per-node list like 2(x3),1 ({exc}). "
            f"Received: {tpn_var}={tpn_text!r}"
        ) from None
    if len(tasks) != len(hosts) or sum(tasks) != ntasks:
        raise UserError(
            f"{tpn_var}={tpn_text} does not lay out {ntasks_var}={ntasks} tasks on the "
            f"{len(hosts)} node(s) of {hosts_var}={hosts_text}. Received: "
            f"{tpn_var}={tpn_text!r}"
        )
    layout = [(h, i) for h, n in zip(hosts, tasks, strict=True) for i in range(n)]
    host, expected_local = layout[procid]
    nodename = env.get("SLURMD_NODENAME", "").strip()
    if local != expected_local or (nodename and nodename != host):
        where = f"{local_var}={local}" + (f", SLURMD_NODENAME={nodename}" if nodename else "")
        raise UserError(
            f"task {procid_var}={procid} runs as {where}, but block distribution puts "
            f"it on {host} as local task {expected_local}; dualtrain derives every "
            f"task's address from the block layout: run srun with --distribution=block "
            f"(Slurm's default). Received: {where}"
        )
    node = next(i for i, n in enumerate(itertools.accumulate(tasks)) if procid < n)
    job = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")).strip() or None
    return SlurmTask(
        rank=procid,
        world_size=ntasks,
        local_rank=local,
        hosts=hosts,
        tasks_per_node=tasks,
        node=node,
        job_id=job,
    )


def slurm_port(env: Mapping[str, str], job_id: str | None) -> int:
    """MASTER_PORT if set, else Lightning's rule: 15000 + the last four digits of the job id (so two
    jobs sharing a node rarely pick the same port), 12910 without a job id."""
    if env.get("MASTER_PORT", "").strip():
        return env_port(env, "MASTER_PORT")
    digits = re.sub(r"\D", "", job_id or "")
    return PORT_OFFSET + int(digits[-4:]) if digits else PORT_NO_JOB


def _foreign_launcher(env: Mapping[str, str]) -> bool:
    """torchrun's variables or a TF_CONFIG: another launcher already placed this process."""
    return all(k in env for k in TORCH_KEYS) or bool(env.get("TF_CONFIG", "").strip())


def slurm_launcher(backend: str, env: Mapping[str, str] | None = None) -> Launcher | None:
    """The Slurm mapping for ``backend`` ("torch" or "tf"), or None when this is no srun task."""
    env = os.environ if env is None else env
    if _foreign_launcher(env):
        return None
    task = slurm_task(env)
    if task is None:
        return None
    where = f"Slurm task {task.rank} of {task.world_size} ({task.host})"
    port = slurm_port(env, task.job_id)
    local_world = task.tasks_per_node[task.node]
    if backend == "torch":
        addr = env.get("MASTER_ADDR", "").strip() or task.hosts[0]
        exported = {
            "RANK": str(task.rank),
            "WORLD_SIZE": str(task.world_size),
            "LOCAL_RANK": str(task.local_rank),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
        }
        return Launcher(
            kind="slurm",
            rank=task.rank,
            world_size=task.world_size,
            local_rank=task.local_rank,
            local_world_size=local_world,
            master_addr=addr,
            master_port=port,
            host=task.host,
            env=exported,
            line=f"{where}, MASTER_ADDR {addr}:{port}",
        )
    base_var = TF_PORT_BASE if env.get(TF_PORT_BASE, "").strip() else None
    base = env_port(env, TF_PORT_BASE) if base_var else port
    top = base + max(task.tasks_per_node) - 1
    if top > 65535:
        raise UserError(
            f"the TF worker ports {base}..{top} run past 65535; set {TF_PORT_BASE} "
            f"lower. Received: port base {base}"
        )
    workers = [f"{h}:{base + i}" for h, i in task.task_hosts()]
    config = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": task.rank}}
    )
    return Launcher(
        kind="slurm",
        rank=task.rank,
        world_size=task.world_size,
        local_rank=task.local_rank,
        local_world_size=local_world,
        tf_cluster={"worker": workers},
        tf_task=f"worker:{task.rank}",
        host=task.host,
        env={"TF_CONFIG": config, "LOCAL_RANK": str(task.local_rank)},
        line=f"{where}, TF worker {task.rank} at {workers[task.rank]} (chief {workers[0]})",
    )
