"""``dualtrain run --dry-run``: every check the run would make, and the plan it would follow, with
nothing written and nothing started (framework-free).

The plan is :func:`dualtrain.driver.runs.resolve_run`'s, the very object
:func:`dualtrain.driver.runs.start_run` carries out: the launcher (local, torchrun, Kubeflow,
TF_CONFIG, Slurm), the world size the launcher imposes, the restart point of an external worker, the
spec checks (:func:`dualtrain.driver.validate.validate`: model shapes, the data and its content,
initial weights, batch sizes, the device), the checkpoint of ``--resume-from`` and the run
directory. This module only turns it into JSON and text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dualtrain.core import data as data_mod
from dualtrain.driver.runs import resolve_run
from dualtrain.driver.validate import say_warnings
from dualtrain.spec import Backend, Experiment, TFStrategy


def plan_run(
    spec: Experiment,
    backend: Backend,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    resume_from: str | Path | None = None,
) -> dict[str, Any]:
    """The resolved plan of ``dualtrain run`` as a JSON-ready dict; raises what the run would."""
    p = resolve_run(spec, backend, out, overwrite=overwrite, resume_from=resume_from)
    say_warnings(p.warnings)  # on stderr, as the run says them; the plan lists them too
    found, spec = p.launcher, p.spec
    plan: dict[str, Any] = {"dry_run": True, "backend": backend.value, "name": spec.name}
    if found is not None:
        tf_strategy = TFStrategy.MULTI_WORKER if backend is Backend.TF else None
        plan.update(
            launcher=found.kind,
            launcher_line=found.line,
            role="worker",
            rank=found.rank,
            local_rank=found.local_rank,
            local_world_size=found.local_world_size,
            processes=1,
        )
    else:
        tf_strategy = spec.tf.strategy if backend is Backend.TF else None
        n = spec.distribution.world_size
        plan.update(
            launcher="local",
            launcher_line=None,
            role="launcher",
            rank=None,
            local_rank=None,
            local_world_size=None,
            processes=1 if tf_strategy is TFStrategy.MIRRORED else n,
        )
    d = spec.distribution
    if backend is Backend.TORCH:
        addr = found.master_addr if found is not None else d.master_addr
        port = found.master_port if found is not None else d.master_port
        plan.update(
            master_addr=addr, master_port=port, tf_strategy=None, tf_cluster=None, tf_task=None
        )
    else:
        assert tf_strategy is not None
        plan.update(
            master_addr=None,
            master_port=None,
            tf_strategy=tf_strategy.value,
            tf_cluster=found.tf_cluster if found is not None else None,
            tf_task=found.tf_task if found is not None else None,
        )
    plan.update(
        world_size=d.world_size,
        spec_world_size=p.spec_world_size,
        env=dict(found.env) if found is not None else {},
        run_dir=os.path.abspath(p.run_dir) if p.run_dir is not None else None,
        run_dir_action=p.action,
        continue_from=str(p.restart.path) if p.restart is not None else None,
        resume_from=str(resume_from) if resume_from is not None else None,
        data=data_mod.locate(spec),
        warnings=list(p.warnings),
    )
    return plan


def format_plan(plan: dict[str, Any]) -> str:
    """The plan for a person: one fact a line."""
    rows = [
        ("backend", plan["backend"]),
        (
            "launcher",
            plan["launcher"]
            + (
                f": {plan['launcher_line']}"
                if plan["launcher_line"]
                else " (dualtrain starts the workers itself)"
            ),
        ),
    ]
    world = str(plan["world_size"])
    if plan["world_size"] != plan["spec_world_size"]:
        world += f" (the launcher's; the spec says {plan['spec_world_size']})"
    rows.append(("world size", world))
    if plan["role"] == "worker":
        local = f", local rank {plan['local_rank']}" + (
            f" of {plan['local_world_size']}" if plan["local_world_size"] else ""
        )
        rows.append(("this process", f"rank {plan['rank']} of {plan['world_size']}{local}"))
    else:
        rows.append(("this process", f"launcher of {plan['processes']} local worker process(es)"))
    if plan["backend"] == "torch":
        port = plan["master_port"] if plan["master_port"] is not None else "<free port at launch>"
        rows.append(("rendezvous", f"{plan['master_addr']}:{port}"))
    else:
        rows.append(("tf strategy", plan["tf_strategy"]))
        if plan["tf_cluster"] is not None:
            rows.append(
                (
                    "tf cluster",
                    ", ".join(f"{k}: {' '.join(v)}" for k, v in plan["tf_cluster"].items()),
                )
            )
            rows.append(("tf task", plan["tf_task"]))
    action = {
        "create": "created by this process",
        "replace": "REPLACED by this process (--overwrite)",
        "continue": f"continued from {plan['continue_from']}",
        None: "written by rank 0; this process writes nothing",
    }[plan["run_dir_action"]]
    rows.append(("run dir", f"{plan['run_dir'] or '(rank 0 picks it)'} ({action})"))
    if plan["resume_from"]:
        rows.append(("resume from", plan["resume_from"]))
    rows.append(("data", plan["data"]))
    if plan["env"]:
        rows.append(("exports", " ".join(f"{k}={v}" for k, v in plan["env"].items())))
    for w in plan["warnings"]:
        rows.append(("warning", w))
    width = max(len(k) for k, _ in rows)
    return "\n".join(
        ["dualtrain: dry run: every check passed; nothing written, nothing started"]
        + [f"  {k:<{width}}  {v}" for k, v in rows]
    )
