"""A run's workers launched and watched (dualtrain.launch.local.run_workers), and restarted from
the latest checkpoint when one fails, up to ``distribution.max_restarts`` times; a worker's user
error is said once, by the launcher. The run directory is written before (dualtrain.driver.runs)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from dualtrain.backends import LaunchModule, launch_module
from dualtrain.driver.rewind import has_trained, truncate_records
from dualtrain.errors import RunFailed, UserError
from dualtrain.launch.forkserver import Warm
from dualtrain.launch.local import run_workers
from dualtrain.records.record import SUMMARY_FILE, read_run
from dualtrain.runtime import checkpoint, probes
from dualtrain.runtime.entry import WORKER_ERROR
from dualtrain.runtime.start import Start
from dualtrain.spec import Backend, Experiment


def launch_with_restarts(
    spec: Experiment,
    backend: Backend,
    run_dir: Path,
    launch: LaunchModule,
    ckpt: Path | None,
    *,
    attempt: int,
    probe: probes.Role | None = None,
    resume_with: str | None = None,
) -> dict[str, Any]:
    """Launch the workers; on a worker failure restart them all from the latest checkpoint, at most
    ``distribution.max_restarts`` times (a user error, exit code 2, is never retried). A stopped or
    failed run says how to continue it: ``resume_with`` (compare: the same compare command), else
    ``dualtrain run --resume RUN_DIR``."""
    print(
        f"dualtrain: {backend.value} run -> {run_dir}"
        + (f" (continuing from {ckpt})" if ckpt is not None else ""),
        flush=True,
    )
    restarts = 0
    while True:
        workers = launch.workers(spec)
        env = Start(resume=ckpt, attempt=attempt, probe=probe).env()
        for w in workers:
            w.env.update(env)
        try:
            run_workers(
                launch.MODULE,
                [str(run_dir)],
                workers,
                unit=launch.UNIT,
                grace_s=spec.distribution.timeout_s,
                run_dir=run_dir,
                stderr_noise=launch.STDERR_NOISE,
                warm=Warm(launch.PRELOAD, launch.preimport_env(spec)),
            )
            break
        except RunFailed as exc:
            raise_worker_user_error(exc, backend, run_dir, resume_with)
            if restarts >= spec.distribution.max_restarts or exc.code == 2:
                more = f" after {restarts} restart(s)" if restarts else ""
                raise RunFailed(
                    f"{backend.value} run failed{more}: {exc} (partial run left in {run_dir}; "
                    f"{resume_hint(run_dir, resume_with)})",
                    rank=exc.rank,
                    code=exc.code,
                ) from None
            restarts += 1
            attempt += 1
            latest = checkpoint.latest(run_dir)
            if latest is not None:
                ckpt_obj = checkpoint.load(latest)  # a tampered latest checkpoint stops the run
                truncate_records(run_dir, ckpt_obj)
            ckpt = latest
            print(
                f"dualtrain: {exc}; restart {restarts}/{spec.distribution.max_restarts} of every "
                f"{launch.UNIT} from {latest or 'step 0 (no checkpoint yet)'}",
                file=sys.stderr,
                flush=True,
            )
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (launch.Terminated): the workers are stopped
            print(
                f"dualtrain: {backend.value} run stopped; partial run left in {run_dir}; "
                f"{resume_hint(run_dir, resume_with)}",
                file=sys.stderr,
                flush=True,
            )
            raise
    if not (run_dir / SUMMARY_FILE).is_file():
        raise RunFailed(f"{backend.value} run finished without writing {run_dir / SUMMARY_FILE}")
    return read_run(run_dir).summary


def raise_worker_user_error(
    exc: RunFailed, backend: Backend, run_dir: Path, resume_with: str | None
) -> None:
    """A worker's user error (exit 2, its message in the run directory) is said once: before the
    first step as the user's mistake (UserError, exit 2); during training (a full disk, say) as the
    run's failure, what it wrote left in place. Returns for any other failure."""
    reported = run_dir / WORKER_ERROR
    if exc.code != 2 or not reported.is_file():
        return
    message = reported.read_text()
    reported.unlink()
    if not has_trained(run_dir):  # before the first step: a mistake, exit 2
        raise UserError(message) from None
    raise RunFailed(
        f"{backend.value} run failed: {message} (partial run left in {run_dir}; "
        f"{resume_hint(run_dir, resume_with)})",
        rank=exc.rank,
        code=exc.code,
    ) from None


def resume_hint(run_dir: Path, resume_with: str | None = None) -> str:
    """What to type to go on from where a stopped or failed run left off: ``resume_with`` (compare:
    the same compare command, which reruns a run without a checkpoint), else the exact --resume
    command where a checkpoint was written, else why there is none."""
    if resume_with is not None:
        return f"continue it with: {resume_with}"
    if checkpoint.latest(run_dir) is None:
        return "no checkpoint to resume from (train.checkpoint_every writes them)"
    return f"continue it with: dualtrain run --resume {shlex.quote(str(run_dir))}"


def refuse_external_launch() -> None:
    """compare (and its replays) launches its own workers for every run: it cannot be one rank of
    someone else's run (under torchrun each rank would start all four runs, and a TF_CONFIG would
    make this process a TensorFlow worker)."""
    for backend, how in (
        (Backend.TORCH, "torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"),
        (Backend.TF, "TF_CONFIG"),
    ):
        if launch_module(backend).detect() is not None:  # detect() only reads the environment
            raise UserError(
                f"dualtrain compare launches its own workers; run it outside "
                f"torchrun, a TF_CONFIG cluster or a multi-task srun step. Received: "
                f"an external {backend.value} launch in the environment ({how} or a "
                f"Slurm step)"
            )
