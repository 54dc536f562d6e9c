"""Start a run: validate, create the run directory, launch the backend's workers (framework-free).

``start_run`` is what ``dualtrain run`` and ``dualtrain compare`` call. Everything that can be a user
mistake is checked before the run directory is created, so a rejected run leaves nothing behind.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from dualtrain import data as mnist
from dualtrain.backends import check_installed, launch_module
from dualtrain.errors import RunFailed, UserError
from dualtrain.launch import run_workers
from dualtrain.model import batchnorm_layers, resolve, where
from dualtrain.plan import ShardPlan
from dualtrain.runner_base import steps_total
from dualtrain.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_INIT, read_run
from dualtrain.spec import Backend, Experiment, dump_spec
from dualtrain.weights import initial_weights, save_weights


def default_run_dir(spec: Experiment, backend: Backend) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(spec.output_dir) / f"{spec.name}-{backend.value}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def validate(spec: Experiment, backend: Backend) -> None:
    """Every check that needs no framework: model shapes, data availability, init weights, batches
    batchnorm can normalise."""
    check_installed(backend)
    resolve(spec.model)
    mnist.locate(spec.data)
    initial_weights(spec.model, spec.seed)  # checks init_from's layout
    check_batchnorm_batches(spec, mnist.sizes(spec.data)[0])


def check_batchnorm_batches(spec: Experiment, num_train: int) -> None:
    """Refuse, before any process starts, a step where a batchnorm layer would normalise over fewer
    than 2 values per channel: on one replica (sync: false) or over the global batch (sync: true).
    Batch sizes repeat every epoch and only the last step of an epoch can be smaller, so the first
    and last steps of the first epoch decide."""
    norms = batchnorm_layers(spec.model)
    if not norms:
        return
    plan = ShardPlan.from_spec(spec, num_train)
    total = steps_total(spec, plan)
    last = plan.steps_per_epoch - 1
    for k in sorted({0, last}):
        if k >= total:
            continue
        sizes = plan.step_sizes(k)
        for r, per_sample in norms:
            what = f"{where(r.prefix)} (batchnorm, sync: {str(r.spec.sync).lower()})"
            at = f"at step {k + 1}{' (the last of every epoch)' if k == last and k else ''}"
            got = (f"Received: batch_size {spec.data.batch_size}, world_size {plan.world_size}, "
                   f"{num_train} train samples, last_batch {spec.data.last_batch.value}")
            if r.spec.sync:
                n = sum(sizes)
                if n * per_sample < 2:
                    raise UserError(f"{what}: {at} the global batch holds {n} sample(s), "
                                    f"{n * per_sample} value(s) per channel; batchnorm needs at least "
                                    f"2. Use data.last_batch: drop. {got}")
                continue
            replica = min(range(len(sizes)), key=lambda i: sizes[i])
            n = sizes[replica]
            if n * per_sample < 2:
                raise UserError(f"{what}: {at} replica {replica} holds {n} sample(s), "
                                f"{n * per_sample} value(s) per channel; batchnorm needs at least 2. "
                                f"Use sync: true (statistics over the global batch) or "
                                f"data.last_batch: drop. {got}")


def _claim_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(path)!r}")
    if path.is_dir() and any(path.iterdir()):
        if not (path / SPEC_FILE).is_file():
            raise UserError(f"--out is a non-empty folder that is not a dualtrain run; choose another. "
                            f"Received: {str(path)!r}")
        if not overwrite:
            raise UserError(f"--out already holds a run; pass --overwrite or choose another folder. "
                            f"Received: {str(path)!r}")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)


def prepare_run_dir(spec: Experiment, backend: Backend, out: str | Path | None,
                    overwrite: bool = False) -> Path:
    validate(spec, backend)
    run_dir = Path(out) if out is not None else default_run_dir(spec, backend)
    existed = run_dir.exists()
    _claim_dir(run_dir, overwrite)
    try:
        (run_dir / SPEC_FILE).write_text(dump_spec(spec))
        save_weights(run_dir / WEIGHTS_INIT, initial_weights(spec.model, spec.seed))
    except BaseException:
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def start_run(spec: Experiment, backend: Backend, out: str | Path | None = None, *,
              overwrite: bool = False) -> tuple[Path | None, dict[str, Any]]:
    """Run ``spec`` on ``backend``; return (run_dir, summary).

    Launched by torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set) or inside a TF_CONFIG cluster,
    this process is one worker: rank 0 writes the run directory, the others return (None, {}).
    Otherwise dualtrain launches ``world_size`` local workers itself.
    """
    launch = launch_module(backend)
    ext = launch.external()
    if ext is not None:
        return _run_as_external_worker(spec, backend, out, overwrite, launch, ext)
    run_dir = prepare_run_dir(spec, backend, out, overwrite)
    print(f"dualtrain: {backend.value} run -> {run_dir}", flush=True)
    try:
        run_workers(launch.MODULE, [str(run_dir)], launch.workers(spec), unit=launch.UNIT,
                    grace_s=spec.distribution.timeout_s, run_dir=run_dir,
                    stderr_noise=launch.STDERR_NOISE)
    except RunFailed as exc:
        raise RunFailed(f"{backend.value} run failed: {exc} (partial run left in {run_dir})") from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (launch.Terminated): the workers are stopped
        print(f"dualtrain: {backend.value} run stopped; partial run left in {run_dir}", file=sys.stderr,
              flush=True)
        raise
    if not (run_dir / SUMMARY_FILE).is_file():
        raise RunFailed(f"{backend.value} run finished without writing {run_dir / SUMMARY_FILE}")
    return run_dir, read_run(run_dir).summary


def _run_as_external_worker(spec: Experiment, backend: Backend, out: str | Path | None,
                            overwrite: bool, launch: Any, ext: dict[str, int]):
    import importlib

    if ext["world_size"] != spec.distribution.world_size:
        print(f"dualtrain: world_size {ext['world_size']} from the launcher overrides the spec's "
              f"{spec.distribution.world_size}", flush=True)
        spec = spec.replace(distribution=_with(spec.distribution, world_size=ext["world_size"]))
    run_dir = prepare_run_dir(spec, backend, out, overwrite) if ext["rank"] == 0 else None
    if run_dir is None:
        validate(spec, backend)
    worker = importlib.import_module(launch.MODULE + ".worker")
    summary = worker.run_worker(spec, run_dir)
    return run_dir, summary


def _with(section: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(section, **changes)
