"""``compare_backends``: run one spec on both backends plus a noise-floor twin, then compare.

Layout of OUT::

    OUT/torch/           the torch run            OUT/twin_init.npz   OUT/torch/weights_init.npz + 1 ulp
    OUT/tf/              the tf run               OUT/verdict.json, report.md, report.html
    OUT/twin/            torch again, from twin_init.npz: the noise floor

Each backend runs in its own worker processes (``dualtrain.runs.start_run``); this process never
imports a framework. The twin answers "how far apart do two runs drift that differ by one ulp in one
weight?", which is the yardstick for the trajectory and final-weights checks.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dualtrain.compare.report import Comparison, compare_dirs, write_report
from dualtrain.errors import UserError
from dualtrain.record import WEIGHTS_INIT
from dualtrain.spec import Backend, Experiment, Sharding
from dualtrain.weights import load_weights, perturb_ulp, save_weights

TWIN_INIT = "twin_init.npz"


def default_out(spec_name: str, output_dir: str | Path = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"compare-{spec_name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _require_backends() -> None:
    import importlib.util

    from dualtrain.backends import PACKAGES

    for backend in (Backend.TORCH, Backend.TF):
        if importlib.util.find_spec(PACKAGES[backend] + ".launch") is None or \
                importlib.util.find_spec(PACKAGES[backend] + ".worker") is None:
            raise UserError(f"compare needs both backends; the {backend.value} backend is not available "
                            f"in this installation (no {PACKAGES[backend]}.worker). Received: "
                            f"dualtrain {backend.value} backend missing")


def _claim_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(out)!r}")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out must be a new or empty folder (compare writes three runs into it). "
                        f"Received: {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)


def twin_element(weights: dict[str, np.ndarray]) -> tuple[str, int]:
    """Which element the twin moves by one ulp: the largest-magnitude weight of the output layer.

    A one-ulp change can be rounded away for good: ``(p + ulp) - lr * g`` rounds to the same float as
    ``p - lr * g`` when the update is larger than ``p`` (measured: moving ``1.bias[0]`` of mnist_mlp
    at lr 0.1 left the twin bit-identical to run A). The output layer's weights get a gradient from
    every sample, and its largest weight is much larger than one update, so the difference survives.
    """
    def layer(name: str) -> int:
        head = name.split(".", 1)[0]
        return int(head) if head.isdigit() else -1

    kernels = [k for k in weights if k.endswith("weight")] or list(weights)
    name = max(kernels, key=lambda k: (layer(k), k))
    return name, int(np.argmax(np.abs(weights[name])))


def twin_world_size(spec: Experiment) -> int:
    """The twin's replica count: another one than the run's, same global batches.

    A one-ulp start alone is injected once and can be rounded away within a few updates (measured:
    in plain SGD the twin stayed within 1.2e-7 of run A for a whole epoch), while the two backends
    differ by rounding at every step. Splitting each global batch over another number of replicas
    groups every gradient sum differently, so the twin carries that per-step rounding noise too,
    and it still trains on exactly the same global batches. (In torch_sampler mode the world size
    decides the batches, so the twin keeps it.)"""
    w = spec.distribution.world_size
    if spec.data.sharding is Sharding.TORCH_SAMPLER:
        return w
    return 1 if w > 1 else 2


def twin_spec(spec: Experiment, init_path: Path, max_steps: int | None = None) -> Experiment:
    """The noise-floor twin: same spec, initial weights moved by one ulp in one element, and the
    global batches split over another number of replicas (twin_world_size)."""
    model = dataclasses.replace(spec.model, init_from=str(init_path))
    train = spec.train if max_steps is None else dataclasses.replace(
        spec.train, max_steps=min(max_steps, spec.train.max_steps or max_steps))
    dist = dataclasses.replace(spec.distribution, world_size=twin_world_size(spec))
    return spec.replace(model=model, train=train, distribution=dist)


def compare_backends(spec: Experiment, out: str | Path, *, twin: bool = True,
                     twin_steps: int | None = None, overlap: bool = False) -> Comparison:
    """Run ``spec`` on torch (OUT/torch) and tf (OUT/tf), then the noise-floor twin (OUT/twin), and
    compare. ``twin_steps`` limits the twin (its steps are checked against the noise floor, the rest
    against the fixed tolerance, and the report says so). ``overlap`` runs the tf run and the twin at
    the same time (faster on many cores; throughput numbers then share the machine)."""
    from dualtrain.runs import start_run, validate

    _require_backends()
    validate(spec, Backend.TORCH)
    validate(spec, Backend.TF)
    out = Path(out)
    _claim_out(out)
    notes: list[str] = []
    timings: list[str] = []
    t0 = time.perf_counter()

    def timed(label: str, run_spec: Experiment, backend: Backend, where: Path) -> Path:
        t = time.perf_counter()
        run_dir, _ = start_run(run_spec, backend, where)
        timings.append(f"{label} {time.perf_counter() - t:.1f}s")
        return run_dir

    torch_dir = timed("torch", spec, Backend.TORCH, out / "torch")
    init_path = (out / TWIN_INIT).resolve()
    tspec = None
    if twin:
        w0 = load_weights(torch_dir / WEIGHTS_INIT)
        name, index = twin_element(w0)
        save_weights(init_path, perturb_ulp(w0, name, index))
        notes.append(f"twin: {name}[{index}] moved by one ulp, world size "
                     f"{twin_world_size(spec)} instead of {spec.distribution.world_size}")
        tspec = twin_spec(spec, init_path, twin_steps)
    if twin and overlap:
        with ThreadPoolExecutor(max_workers=2) as pool:
            f_tf = pool.submit(timed, "tf", spec, Backend.TF, out / "tf")
            f_twin = pool.submit(timed, "twin", tspec, Backend.TORCH, out / "twin")
            tf_dir, twin_dir = f_tf.result(), f_twin.result()
        notes.append("the tf run and the twin ran at the same time: throughput is not comparable")
    else:
        tf_dir = timed("tf", spec, Backend.TF, out / "tf")
        twin_dir = timed("twin", tspec, Backend.TORCH, out / "twin") if twin else None
    if not twin:
        notes.append("no noise-floor twin: trajectory and final weights use the fixed tolerances")
    elif twin_steps is not None:
        notes.append(f"the twin ran {twin_steps} steps only")
    notes.append(f"runs took {time.perf_counter() - t0:.1f}s ({', '.join(timings)})")
    cmp = compare_dirs(torch_dir, tf_dir, twin_dir, notes)
    write_report(cmp, out)
    return cmp
