"""The Python API: ``dualtrain.run``, ``compare``, ``resume`` and ``experiment``.

The same operations as ``dualtrain run`` and ``dualtrain compare`` (the CLI commands call these
functions), returning typed results instead of exit codes. Like the CLI, this module never imports
torch, TensorFlow or Keras: every run trains in its own worker processes. See docs/python-api.md.

Spec overrides (``run``, ``compare``, ``experiment``), applied in this order, later wins:

1. keyword arguments named after a spec section take a dict that is merged into that section,
   nested dicts recursively (``train={"epochs": 1}``, ``optimizer={"schedule": {"name": "step"}}``);
   keyword arguments named after a top-level field set it (``seed=1``, ``name="x"``). A ``model``
   dict that names ``preset`` or ``layers`` replaces both (they are mutually exclusive).
2. ``set=["train.epochs=1", ...]``: the CLI's ``--set`` strings (values parsed as YAML).
3. ``world_size=N`` and ``precision="fp16"`` (or a precision section dict): the CLI's
   ``--world-size`` and ``--precision``.

The result is validated by the YAML loader itself (``dualtrain.spec.from_dict``): an unknown key or
a bad value raises the same one-line :class:`UserError`, naming the field, before anything is
written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dualtrain.api.comparison import compare
from dualtrain.api.output import say, silenced
from dualtrain.api.overrides import PathLike, SpecLike, experiment
from dualtrain.api.results import CompareResult, RunResult, build_run_result, finished_line
from dualtrain.backends import parse_backend
from dualtrain.driver.runs import resume_run, start_run
from dualtrain.errors import RunFailed, UserError
from dualtrain.spec import Backend

__all__ = [
    "CompareResult",
    "RunFailed",
    "RunResult",
    "SpecLike",
    "UserError",
    "compare",
    "experiment",
    "resume",
    "run",
]


# ---- the spec ------------------------------------------------------------------------------------


def _backend(backend: str) -> Backend:
    return parse_backend(str(backend))  # a dualtrain.spec.Backend is a str too


# ---- run / resume --------------------------------------------------------------------------------


def run(
    spec: SpecLike,
    backend: str = "torch",
    *,
    out: PathLike | None = None,
    overwrite: bool = False,
    resume_from: PathLike | None = None,
    world_size: int | None = None,
    precision: str | Mapping[str, Any] | None = None,
    set: Sequence[str] = (),
    quiet: bool = False,
    **overrides: Any,
) -> RunResult:
    """Train ``spec`` on ``backend`` (``"torch"`` or ``"tf"``), like ``dualtrain run``.

    ``out``: the run directory (default ``<output_dir>/<name>-<backend>-<time>``); ``overwrite``:
    replace the run already in ``out``; ``resume_from``: a checkpoint folder of either backend this
    new run continues from. Overrides: see the module docstring. ``quiet``: no dualtrain lines of
    this process on stdout (the workers' progress still shows).

    Started by torchrun or inside a TF_CONFIG cluster, this process is one rank of that run: see
    :class:`RunResult` ``is_chief``.

    Raises:
        UserError: a mistake in the spec, the overrides or the paths; nothing was written.
        RunFailed: a worker failed (the partial run directory stays, named in the message).
    """
    b = _backend(backend)
    resolved = experiment(spec, world_size=world_size, precision=precision, set=set, **overrides)
    with silenced(quiet):
        run_dir, summary = start_run(
            resolved, b, _path(out), overwrite=overwrite, resume_from=_path(resume_from)
        )
    return _finished(build_run_result(b, run_dir, summary, resolved), quiet)


def resume(
    run_dir: PathLike,
    *,
    backend: str | None = None,
    world_size: int | None = None,
    quiet: bool = False,
) -> RunResult:
    """Continue a stopped or killed run from its latest complete checkpoint, in its own folder and
    with its own spec, like ``dualtrain run --resume RUN_DIR``; ``world_size`` may change (sharding
    exact). ``backend``, if given, must be the checkpoint's."""
    b = _backend(backend) if backend is not None else None
    with silenced(quiet):
        path, summary = resume_run(Path(run_dir), b, world_size)
    return _finished(build_run_result(_backend(summary["backend"]), path, summary, None), quiet)


def _finished(result: RunResult, quiet: bool) -> RunResult:
    if result.is_chief and not quiet:
        say(finished_line(result))
    return result


# ---- compare -------------------------------------------------------------------------------------


def _path(path: PathLike | None) -> Path | None:
    return None if path is None else Path(path)
