"""Where a worker starts: a fresh run or a checkpoint (:class:`Start`, handed from the launcher to
every worker), the continuation checks, the run's length and the default thread count."""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualtrain.core.plan import ShardPlan
from dualtrain.errors import UserError
from dualtrain.records.envinfo import usable_cores
from dualtrain.runtime import checkpoint, probes
from dualtrain.runtime.checkpoint import Checkpoint
from dualtrain.spec import Device, Experiment

#: Set by dualtrain's launcher for every worker process: the checkpoint folder to continue from.
RESUME_ENV = "DUALTRAIN_RESUME"
#: Set by dualtrain's launcher for every worker process: 0 for a run's first attempt, n after n
#: restarts or resumes. Its presence tells a worker that dualtrain's launcher started it.
ATTEMPT_ENV = "DUALTRAIN_ATTEMPT"


def settle_gc() -> None:
    """The end of a worker's start-up (dualtrain.runtime.worker.train_loop, right before training).

    A worker's entry (``python -m dualtrain.backends.<name>``) turns Python's cyclic garbage
    collector off before it imports its framework: importing torch with torch._dynamo (which DDP's
    constructor needs) or TensorFlow with Keras creates hundreds of thousands of objects, and the
    collections they trigger were ~20% of the import (measured: torch + torch._dynamo 2.5-2.8 s with
    the collector, 1.9-2.2 s without). Here what start-up created is frozen (out of the collector's
    sight: its cycles are a few MB that live as long as the process anyway, and no later collection
    walks them) and the collector is on again. A no-op where it was never turned off (a run inside
    another launcher's process)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def steps_total(spec: Experiment, plan: ShardPlan) -> int:
    by_epochs = spec.train.epochs * plan.steps_per_epoch if spec.train.epochs is not None else None
    if spec.train.max_steps is None:
        assert by_epochs is not None  # TrainSpec requires epochs or max_steps
        return by_epochs
    return spec.train.max_steps if by_epochs is None else min(by_epochs, spec.train.max_steps)


def default_threads(local_workers: int) -> int:
    """The cores this process may run on (a Slurm or cgroup CPU binding, taskset), not the
    machine's, shared by the host's local workers."""
    return max(1, (usable_cores() or os.cpu_count() or 1) // max(local_workers, 1))


def worker_cores(local_rank: int, local_workers: int, threads: int) -> list[int] | None:
    """The cores local worker ``local_rank`` of ``local_workers`` runs on
    (distribution.bind_cores): the ``local_rank``-th block of ``threads`` of the usable cores, where
    two or more workers' blocks fit in them; None: no binding (one worker, or more threads than
    cores)."""
    try:
        usable = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return None
    if local_workers < 2 or local_workers * threads > len(usable):
        return None
    return usable[local_rank * threads : (local_rank + 1) * threads]


def bind_cores(spec: Experiment, local_rank: int, local_workers: int, threads: int) -> None:
    """Bind this worker process to its cores (worker_cores) when distribution.bind_cores and the
    device is the CPU, before its framework starts a thread. The MLP at world 2 on 2 cores
    (bench/bench_torch.py): 1.15x a hand-written DDP loop bound, 0.90-0.98x unbound."""
    if not spec.distribution.bind_cores or spec.distribution.device is not Device.CPU:
        return
    cores = worker_cores(local_rank, local_workers, threads)
    if cores is not None:
        os.sched_setaffinity(0, cores)


@dataclass(frozen=True)
class Start:
    """Where a worker starts: the checkpoint it continues from (None: step 0), its attempt (0 for
    a run's first, n after n restarts or resumes) and its part in the one-step probes. Passed to
    ``run_worker`` as an argument; only between processes (dualtrain's launcher -> a worker
    process) does it travel in the environment (:meth:`env`, :meth:`from_env`)."""

    resume: Path | None = None
    attempt: int = 0
    launched: bool = False
    """Started by dualtrain's own launcher (which reports a worker's user error once)."""
    probe: probes.Role | None = None
    """Its part in compare's one-step probes (dualtrain.runtime.probes); None: none."""

    def env(self) -> dict[str, str]:
        return {
            ATTEMPT_ENV: str(self.attempt),
            **({RESUME_ENV: str(self.resume)} if self.resume is not None else {}),
            **(self.probe.env() if self.probe is not None else {}),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Start:
        env = os.environ if env is None else env
        path = env.get(RESUME_ENV, "").strip()
        return cls(
            resume=Path(path) if path else None,
            attempt=int(env.get(ATTEMPT_ENV) or 0),
            launched=ATTEMPT_ENV in env,
            probe=probes.parse_role(env.get(probes.PROBE_ENV, "")),
        )


def resume_checkpoint(spec: Experiment, start: Start) -> Checkpoint | None:
    """The checkpoint this worker continues from, checked against the spec."""
    if start.resume is None:
        return None
    ckpt = checkpoint.load(start.resume)
    check_continuation(ckpt.state, spec, ckpt.path)
    return ckpt


def check_continuation(state: dict[str, Any], spec: Experiment, where: Any) -> None:
    """A checkpoint can continue ``spec`` only if it is the same training run (model, optimizer,
    data, precision, length); the world size may change only with sharding ``exact``."""
    diff = checkpoint.spec_difference(state["spec"], spec.to_dict())
    if diff is not None:
        raise UserError(f"checkpoint {where} is of another training run: {diff}")
    if state["world_size"] != spec.distribution.world_size and spec.data.sharding.value != "exact":
        raise UserError(
            f"checkpoint {where} was written at world_size {state['world_size']}; with "
            f"data.sharding torch_sampler the global batches depend on the world size, so "
            f"the run can only continue at world_size {state['world_size']} (sharding "
            f"exact can change it). Received: world_size {spec.distribution.world_size}"
        )


def check_same_model(state: dict[str, Any], sha256: str, where: Any) -> None:
    """A model pair's checkpoint continues only the same pair: its code, arrays and weight map
    (dualtrain.core.pair.Layout.digest) as recorded then."""
    recorded = state.get("model_sha256") or ""
    if recorded != sha256:
        what = "dualtrain's own layers" if not recorded else f"a model pair {recorded[:12]}..."
        now = "dualtrain's own layers" if not sha256 else f"the pair now gives {sha256[:12]}..."
        raise UserError(
            f"checkpoint {where} was trained as {what}; {now} (the model's code or weight map "
            f"changed). Received: another model"
        )


def check_same_data(state: dict[str, Any], sha256: str, where: Any) -> None:
    """A checkpoint continues only on the data it was trained on: the content digest it recorded
    (dualtrain.core.data) must be the data's now, wherever the files lie (data.path and
    data.data_dir may change)."""
    recorded = state.get("data_sha256")
    if recorded and sha256 and recorded != sha256:
        raise UserError(
            f"checkpoint {where} was trained on other data (content sha256 {recorded[:12]}...); "
            f"the data now has {sha256[:12]}... Received: data with another content"
        )
