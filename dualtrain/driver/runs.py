"""Start a run: validate, create the run directory, launch the backend's workers (framework-free).

``start_run`` is what ``dualtrain run`` and ``dualtrain compare`` call. Everything that can be a
user mistake is checked before the run directory is created, so a rejected run leaves nothing
behind.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dualtrain.backends import LaunchModule, launch_module, parse_backend
from dualtrain.core import pair
from dualtrain.core.data.dataset import Data, write_record
from dualtrain.core.weights import initial_weights, save_weights
from dualtrain.driver.launching import launch_with_restarts
from dualtrain.driver.pair import pair_layout
from dualtrain.driver.rewind import check_records, copy_records, truncate_records
from dualtrain.driver.validate import check_out_dir, say_warnings, validate
from dualtrain.errors import UserError
from dualtrain.jsonio import new_folder, write_atomic
from dualtrain.launch import cluster
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_INIT
from dualtrain.runtime import checkpoint, probes
from dualtrain.runtime.entry import run_spec
from dualtrain.runtime.start import (
    Start,
    check_continuation,
    check_same_data,
    check_same_model,
)
from dualtrain.spec import Backend, Experiment, Strategy, dump_spec


def default_run_dir(spec: Experiment, backend: Backend) -> Path:
    return new_folder(spec.output_dir, f"{spec.name}-{backend.value}")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What ``dualtrain run`` will do, with every check made and nothing written or started.

    :func:`resolve_run` makes it; :func:`start_run` carries it out and ``--dry-run``
    (:mod:`dualtrain.driver.dryrun`) prints it, so the run and its dry run make the same checks by
    construction (one code path, not two kept in step)."""

    spec: Experiment
    """The spec the workers train (its world size is the external launcher's, if there is one)."""
    backend: Backend
    spec_world_size: int
    """The world size the spec asked for."""
    launcher: cluster.Launcher | None
    """The external launcher that started this process as one rank (None: dualtrain launches)."""
    run_dir: Path | None
    """Where the run lives; None when an external rank other than 0 was given no --out."""
    action: str | None
    """create | replace (--overwrite) | continue (a restarted external worker) | None (this process,
    an external rank other than 0, writes nothing)."""
    resume: checkpoint.Checkpoint | None = None
    """--resume-from: the checkpoint (of either backend) a new run continues from."""
    restart: checkpoint.Checkpoint | None = None
    """A restarted external worker's latest checkpoint of the unfinished run in --out."""
    warnings: tuple[str, ...] = ()
    data: Data | None = None
    """The checked data (its record goes into the run directory as data.json)."""

    @property
    def writer_dir(self) -> Path | None:
        """The run directory this process writes (None: another rank writes it)."""
        return self.run_dir if self.action is not None else None


def resolve_run(
    spec: Experiment,
    backend: Backend,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    resume_from: str | Path | None = None,
) -> RunPlan:
    """Every check of ``dualtrain run`` before anything is written: the external launcher (its
    ``detect`` reads the environment and changes nothing) and the world size it imposes, a
    restarted external worker's checkpoint, ``--resume-from`` (the checkpoint, its spec, its
    records), the spec (:func:`validate`) and the run directory (:func:`check_out_dir`). Raises
    :class:`UserError` on a mistake; reads only."""
    found = launch_module(backend).detect()
    spec_world = spec.distribution.world_size
    if spec.distribution.strategy is Strategy.PARAMETER_SERVER and (
        found is not None or resume_from is not None
    ):
        raise UserError(
            "distribution.strategy: parameter_server runs under dualtrain's own launcher and "
            "starts from scratch (its server is a process dualtrain starts beside the replicas); "
            f"use all_reduce here. Received: "
            f"{'launcher ' + found.kind if found is not None else '--resume-from'}"
        )
    if found is not None:
        refuse_resume_from(resume_from)
        return _external_plan(spec, backend, found, out, overwrite)
    resume = None
    if resume_from is not None:
        resume = checkpoint.load(resume_from)
        check_continuation(resume.state, spec, resume.path)
        check_records(resume)
    checked = validate(spec, backend)
    if resume is not None:
        check_same_data(resume.state, checked.data.sha256, resume.path)
        check_same_model(resume.state, _model_sha256(spec), resume.path)
    run_dir = Path(out) if out is not None else default_run_dir(spec, backend)
    action = "replace" if check_out_dir(run_dir, overwrite) else "create"
    return RunPlan(
        spec,
        backend,
        spec_world,
        None,
        run_dir,
        action,
        resume=resume,
        warnings=checked.warnings,
        data=checked.data,
    )


def _external_plan(
    spec: Experiment,
    backend: Backend,
    found: cluster.Launcher,
    out: str | Path | None,
    overwrite: bool,
) -> RunPlan:
    """This process is one rank of a run an external launcher started (``found``): the world
    size it imposes, a restarted worker's checkpoint in ``out``, and which rank writes."""
    spec_world = spec.distribution.world_size
    if found.world_size != spec_world:
        spec = spec.replace(distribution=_with(spec.distribution, world_size=found.world_size))
    latest = _external_restart_point(out)
    restart = checkpoint.load(latest) if latest is not None else None
    if restart is not None:
        check_continuation(restart.state, spec, restart.path)
    checked = validate(spec, backend)
    data = checked.data
    if restart is not None:
        check_same_data(restart.state, data.sha256, restart.path)
        check_same_model(restart.state, _model_sha256(spec), restart.path)
    warnings: tuple[str, ...] = checked.warnings + (
        ()
        if out is not None
        else (
            (
                "no --out: rank 0 writes a new timestamped folder, so a restarted worker "
                "cannot find the run's checkpoints; give every replica the same --out on "
                "shared storage"
            ),
        )
    )
    chief = found.rank == 0
    run_dir = Path(out) if out is not None else None
    if restart is not None:
        action = "continue" if chief else None
    elif chief:
        run_dir = run_dir or default_run_dir(spec, backend)
        action = "replace" if check_out_dir(run_dir, overwrite) else "create"
    else:
        action = None
    return RunPlan(
        spec,
        backend,
        spec_world,
        found,
        run_dir,
        action,
        restart=restart,
        warnings=warnings,
        data=data,
    )


def _model_sha256(spec: Experiment) -> str:
    return pair_layout(spec)[0].digest() if spec.model.is_pair else ""


def _write_run_dir(plan: RunPlan) -> Path:
    """Create (or, for "replace", empty) the planned run directory and write the spec and the
    initial weights; on a failure a folder this call created is removed."""
    run_dir = plan.run_dir
    assert run_dir is not None and plan.action in ("create", "replace"), plan
    existed = run_dir.exists()
    if plan.action == "replace":  # resolve_run checked that it holds a dualtrain run
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        (run_dir / SPEC_FILE).write_text(dump_spec(plan.spec))
        if plan.spec.model.is_pair:
            layout, weights = pair_layout(plan.spec)
            pair.write(layout, run_dir)
        else:
            weights = initial_weights(plan.spec.model, plan.spec.seed)
        save_weights(run_dir / WEIGHTS_INIT, weights)
        if plan.data is not None:
            write_record(plan.data, run_dir)
    except BaseException:
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def start_run(
    spec: Experiment,
    backend: Backend,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    resume_from: str | Path | None = None,
    probe: probes.Role | None = None,
    resume_with: str | None = None,
    warned: Collection[str] = (),
) -> tuple[Path | None, dict[str, Any]]:
    """Run ``spec`` on ``backend``; return (run_dir, summary).

    Launched by torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set), inside a TF_CONFIG cluster
    or as one task of a multi-task srun step, this process is one worker: rank 0 writes the run
    directory, the others return (None, {}). Under Slurm the torchrun variables / TF_CONFIG derived
    from Slurm's (dualtrain/launch/cluster.py) are exported into os.environ before this process
    becomes the rank. Otherwise dualtrain launches ``world_size`` local workers itself.

    ``resume_from``: a checkpoint folder (of either backend) this new run continues from; its
    records up to the checkpoint are copied in, so the run reads as one run of ``spec``.

    ``probe``: the run's part in compare's one-step probes (dualtrain.runtime.probes), passed to the
    workers. ``resume_with``: what continues the run if it stops (launch_with_restarts).
    ``warned``: warnings the caller has said already (compare's, for its four runs).
    """
    plan = resolve_run(spec, backend, out, overwrite=overwrite, resume_from=resume_from)
    say_warnings(plan.warnings, warned)
    launch = launch_module(backend)
    if plan.launcher is not None:
        return _run_as_external_worker(plan, launch)
    run_dir = plan.run_dir
    assert run_dir is not None
    fresh = not run_dir.exists()
    _write_run_dir(plan)
    try:
        if plan.resume is not None:
            copy_records(plan.resume, run_dir)
        return run_dir, launch_with_restarts(
            plan.spec,
            backend,
            run_dir,
            launch,
            plan.resume.path if plan.resume else None,
            attempt=0,
            probe=probe,
            resume_with=resume_with,
        )
    except UserError:
        # A worker stopped on a user mistake before training: nothing of this call's run stays.
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def refuse_resume_from(resume_from: str | Path | None) -> None:
    """Under an external launcher every worker starts from the same command: a continuation from
    another run's checkpoint is dualtrain's own launcher's job."""
    if resume_from is not None:
        raise UserError(
            "--resume-from is for runs dualtrain launches; under torchrun, a TF_CONFIG "
            "cluster or a Slurm step start the run with dualtrain's own launcher. "
            f"Received: {resume_from}"
        )


def resume_run(
    run_dir: str | Path,
    backend: Backend | None = None,
    world_size: int | None = None,
    probe: probes.Role | None = None,
    resume_with: str | None = None,
    warned: Collection[str] = (),
) -> tuple[Path, dict[str, Any]]:
    """``dualtrain run --resume RUN_DIR``: continue a stopped or killed run from its latest complete
    checkpoint, on the checkpoint's backend, optionally at another world size (sharding exact)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"--resume needs a run directory. Received: {str(run_dir)!r}")
    spec = run_spec(run_dir)
    if (run_dir / SUMMARY_FILE).is_file():
        raise UserError(
            f"{run_dir} has finished (summary.json exists); nothing to resume. To train "
            f"further, start a new run with --resume-from {run_dir / checkpoint.DIR}/<step>"
        )
    path = checkpoint.latest(run_dir)
    if path is None:
        raise UserError(
            f"{run_dir} has no complete checkpoint to resume from (set "
            f"train.checkpoint_every to write them). Received: {str(run_dir)!r}"
        )
    ckpt = checkpoint.load(path)
    ckpt_backend = parse_backend(ckpt.state["backend"])
    if backend is not None and backend is not ckpt_backend:
        raise UserError(
            f"--resume continues on the checkpoint's backend ({ckpt_backend.value}); to "
            f"continue it in {backend.value}, start a new run: dualtrain run --backend "
            f"{backend.value} --config {run_dir / SPEC_FILE} --resume-from {path} --out "
            f"NEW_DIR. Received: --backend {backend.value}"
        )
    if world_size is not None and world_size != spec.distribution.world_size:
        spec = spec.replace(distribution=_with(spec.distribution, world_size=world_size))
    check_continuation(ckpt.state, spec, ckpt.path)
    checked = validate(spec, ckpt_backend)
    check_same_data(ckpt.state, checked.data.sha256, ckpt.path)
    check_same_model(ckpt.state, _model_sha256(spec), ckpt.path)
    say_warnings(checked.warnings, warned)  # the run goes ahead: every check passed
    launch = launch_module(ckpt_backend)
    # Everything is checked: now cut the records back to the checkpoint and record the new spec.
    write_atomic(run_dir / SPEC_FILE, dump_spec(spec))
    truncate_records(run_dir, ckpt)
    attempt = len(ckpt.state.get("history", [])) + 1
    return run_dir, launch_with_restarts(
        spec,
        ckpt_backend,
        run_dir,
        launch,
        ckpt.path,
        attempt=attempt,
        probe=probe,
        resume_with=resume_with,
    )


def _run_as_external_worker(
    plan: RunPlan, launch: LaunchModule
) -> tuple[Path | None, dict[str, Any]]:
    assert plan.launcher is not None
    cluster.apply(plan.launcher)
    if plan.spec_world_size != plan.spec.distribution.world_size:
        print(
            f"dualtrain: world_size {plan.spec.distribution.world_size} from the launcher "
            f"overrides the spec's {plan.spec_world_size}",
            flush=True,
        )
    if plan.restart is not None:
        # A restarted worker of an external launcher (torchrun --max-restarts, a Kubernetes restart
        # policy): --out holds this run, unfinished, with a complete checkpoint, so every rank
        # continues from it by itself (the chief cuts the records back to it). The ranks check that
        # they all start at the same step (TrainLoop.run).
        start = Start(
            resume=plan.restart.path, attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 1)
        )
        if plan.action == "continue":
            assert plan.run_dir is not None
            truncate_records(plan.run_dir, plan.restart)
            print(
                f"dualtrain: restarted worker: continuing {plan.run_dir} from {plan.restart.path}",
                flush=True,
            )
    else:
        start = Start()
        if plan.action is not None:
            _write_run_dir(plan)
    worker = importlib.import_module(launch.MODULE + ".worker")
    summary = worker.run_worker(plan.spec, plan.writer_dir, start)
    return plan.writer_dir, summary


def _external_restart_point(out: str | Path | None) -> Path | None:
    """The checkpoint a restarted external worker continues from: --out holds an unfinished run
    (spec.yaml, no summary.json) with a complete checkpoint. None for a fresh start."""
    if out is None or not (Path(out) / SPEC_FILE).is_file() or (Path(out) / SUMMARY_FILE).is_file():
        return None
    return checkpoint.latest(out)


def _with(section: Any, **changes: Any) -> Any:
    return dataclasses.replace(section, **changes)
