"""Command-line entry points shared by both backends' worker and tool modules (framework-free).

``python -m dualtrain.backends.<name> RUN_DIR`` and ``python -m dualtrain.backends.<name>.tools
forward ...`` differ only in the function they call; the argument checks, spec loading and the
one-line error convention (exit 2 for a user-facing problem, traceback only for bugs) live here.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import signal
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import yaml

from dualtrain.core import kernels, pair
from dualtrain.core.data import TEST, open_data
from dualtrain.core.weights import Weights, check_layout, load_weights, save_weights
from dualtrain.errors import RunFailed, UserError
from dualtrain.records.envinfo import cpu_flags
from dualtrain.records.record import SPEC_FILE
from dualtrain.runtime.start import Start
from dualtrain.spec import Experiment, from_dict, load_spec


def run_spec(run_dir: Path) -> Experiment:
    path = Path(run_dir) / SPEC_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} has no {SPEC_FILE}: not a dualtrain run directory")
    return from_dict(yaml.safe_load(path.read_text()))


def enable_stack_dump() -> None:
    """``kill -USR1 PID`` (and the launcher, for a worker that outlives the others) prints every
    thread's Python stack to this process's stderr."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


#: The entry-point group of worker hooks: each entry is called in every worker of every backend
#: right before its engine is built, as ``hook(backend)``, and returns what it changed (None:
#: nothing). Nothing dualtrain installs is in it: the test suite puts one distribution on its
#: processes' path (testkit/worker_hooks.py) whose entry changes one backend's arithmetic on purpose
#: (the detection-power tests). A worker whose hook changed something says so on stderr and in
#: summary.json (``test_hook``).
WORKER_HOOKS = "dualtrain.worker_hooks"


def run_worker_hooks(backend: str) -> dict[str, str]:
    """Call every installed worker hook; return what summary.json should record about them."""
    said = []
    for entry in entry_points(group=WORKER_HOOKS):
        text = entry.load()(backend)
        if text:
            print(
                f"dualtrain {backend} worker: WARNING: worker hook {entry.value} changed this "
                f"run: {text} (tests only)",
                file=sys.stderr,
                flush=True,
            )
            said.append(str(text))
    return {"test_hook": "; ".join(said)} if said else {}


#: Where a worker started by dualtrain's launcher leaves the user error it stopped on (the first
#: worker to stop writes it): the launcher reports it once, as its own one-line error.
WORKER_ERROR = "worker-error.txt"


def _report_to_launcher(run_dir: Path, message: str, launched: bool) -> bool:
    """Leave ``message`` for dualtrain's launcher (True), or False under another launcher (torchrun,
    a TF_CONFIG cluster, srun), where the worker's own stderr line is the report."""
    if not launched or not run_dir.is_dir():
        return False
    try:
        with open(run_dir / WORKER_ERROR, "x") as f:
            f.write(message)
    except FileExistsError:
        pass  # another worker stopped on it first: one report
    except OSError:
        return False
    return True


def exit_now(code: int) -> NoReturn:
    """End a worker process without interpreter teardown, once its run is complete and its files
    are closed (RunWriter closes them before the run returns): joining the communication library's
    threads at exit can stall a finished worker, and tearing TensorFlow down takes about a second
    per worker process (measured with `dualtrain run --backend tf`, one step, mirrored and
    multi_worker: 1.0-1.3 s from the last Python exit handler to the process's exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker_main(
    backend: str, argv: list[str], run_worker: Callable[[Experiment, Path, Start], Any]
) -> int:
    """``python -m dualtrain.backends.<backend> RUN_DIR``: run one worker of the run in RUN_DIR."""
    if len(argv) != 1:
        print(f"usage: python -m dualtrain.backends.{backend} RUN_DIR", file=sys.stderr)
        return 2
    enable_stack_dump()
    start = Start.from_env()  # what dualtrain's launcher set for this process
    try:
        run_dir = Path(argv[0])
        run_worker(run_spec(run_dir), run_dir, start)
    except UserError as exc:
        if not _report_to_launcher(Path(argv[0]), str(exc), start.launched):
            print(f"dualtrain {backend} worker: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except RunFailed as exc:  # a lost peer (dualtrain.launch.peers): the launcher names the rank
        print(f"dualtrain {backend} worker: error: {exc}", file=sys.stderr, flush=True)
        if exc.hard_exit:  # no interpreter teardown (RunFailed.hard_exit)
            exit_now(1)
        return 1
    return 0


def forward_main(
    backend: str,
    argv: list[str],
    forward_logits: Callable[[Experiment, Weights, list[np.ndarray], Any], np.ndarray],
) -> int:
    """``python -m dualtrain.backends.<backend>.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ``:
    float32 outputs (logits) of the first N test samples under the canonical weights (key
    "logits")."""
    if len(argv) != 5 or argv[0] != "forward":
        print(
            f"usage: python -m dualtrain.backends.{backend}.tools forward SPEC_YAML WEIGHTS_NPZ N "
            "OUT_NPZ",
            file=sys.stderr,
        )
        return 2
    _, spec_path, weights_path, n_text, out = argv
    try:
        spec = load_spec(spec_path)
        weights = load_weights(weights_path)
        check_layout(weights, spec.model, source=weights_path)
        try:
            n = int(n_text)
        except ValueError:
            raise UserError(f"N must be an integer. Received: {n_text!r}") from None
        # the first N of the whole test split
        data = open_data(spec.replace(data=dataclasses.replace(spec.data, test_limit=None)))
        if not 1 <= n <= data.size(TEST):
            raise UserError(f"N must be in 1..{data.size(TEST)}. Received: {n}")
        layout = _pair_beside(spec, spec_path)
        logits = forward_logits(spec, weights, data.inputs(TEST, slice(0, n)), layout)
    except UserError as exc:
        print(f"dualtrain: error: {exc}", file=sys.stderr)
        return 2
    np.savez(out, logits=logits)
    return 0


def _pair_beside(spec: Experiment, spec_path: str) -> Any:
    """A model pair's map, which lies beside the run's spec (model_pair.json); None for
    dualtrain's own layers."""
    if not spec.model.is_pair:
        return None
    layout = pair.read(Path(spec_path).parent)
    if layout is None:
        raise UserError(f"{Path(spec_path).parent} has no {pair.PAIR_FILE} (a model pair's map)")
    return layout


def export_main(
    backend: str, argv: list[str], export: Callable[[Experiment, Weights, str, Any], None]
) -> int:
    """``python -m dualtrain.backends.<backend>.tools export SPEC_YAML WEIGHTS_NPZ OUT_FOLDER``: the
    backend's export of those weights, written into OUT_FOLDER (dualtrain.driver.export)."""
    if len(argv) != 4:
        print(
            f"usage: python -m dualtrain.backends.{backend}.tools export SPEC_YAML WEIGHTS_NPZ "
            "OUT_FOLDER",
            file=sys.stderr,
        )
        return 2
    _, spec_path, weights_path, out = argv
    try:
        spec = load_spec(spec_path)
        weights = load_weights(weights_path)
        check_layout(weights, spec.model, source=weights_path)
        export(spec, weights, out, _pair_beside(spec, spec_path))
    except UserError as exc:
        print(f"dualtrain: error: {exc}", file=sys.stderr)
        return 2
    return 0


def env_main(backend: str, argv: list[str], facts: Callable[[], dict[str, Any]]) -> int:
    """``python -m dualtrain.backends.<backend>.tools env``: this backend's facts (versions,
    devices, kernel settings) as one JSON object on stdout; ``dualtrain env`` runs it
    (docs/env.md)."""
    if len(argv) != 1:
        print(f"usage: python -m dualtrain.backends.{backend}.tools env", file=sys.stderr)
        return 2
    print(json.dumps(facts(), default=str), flush=True)
    return 0


def env_facts(backend_facts: Callable[[], dict[str, Any]], backend_kernels: Any) -> dict[str, Any]:
    """A backend's facts for ``dualtrain env``: its environment facts and its low-precision
    kernels (implementation, native or emulated, and the calibration of bf16 and fp16 measured
    now; dualtrain.core.kernels). ``backend_kernels``: the backend's kernels module (its
    ``static_facts`` and ``product``)."""
    facts = backend_facts()
    static = backend_kernels.static_facts(cpu_flags())
    return {**facts, "kernels": kernels.facts(static, backend_kernels.product, kernels.DTYPES)}


def describe_main(
    backend: str,
    argv: list[str],
    describe: Callable[..., tuple[dict[str, Any], dict[str, np.ndarray] | None]],
) -> int:
    """``python -m dualtrain.backends.<backend>.tools describe SPEC_YAML OUT_FOLDER [FILE]``: this
    backend's side of a model pair (dualtrain.core.pair) as OUT_FOLDER/side.json, and the torch
    side's initial weights as OUT_FOLDER/weights.npz (dualtrain.driver.pair reads both). FILE,
    where given, is passed on to ``describe`` (the TF side of a converted pair: the torch side's
    converted.json, which holds the port)."""
    if len(argv) not in (3, 4):
        print(
            f"usage: python -m dualtrain.backends.{backend}.tools {argv[0] if argv else 'describe'}"
            f" SPEC_YAML OUT_FOLDER [FILE]",
            file=sys.stderr,
        )
        return 2
    spec_path, out = argv[1], argv[2]
    try:
        side, weights = describe(load_spec(spec_path), *argv[3:])
    except UserError as exc:
        print(f"dualtrain: error: {exc}", file=sys.stderr)
        return 2
    if weights is not None:
        save_weights(Path(out) / "weights.npz", weights)
    (Path(out) / "side.json").write_text(json.dumps(side))
    return 0


def probe_layers_main(backend: str, argv: list[str], probe: Callable[..., dict[str, Any]]) -> int:
    """``python -m dualtrain.backends.<backend>.tools probe-layers SPEC_YAML WEIGHTS_NPZ BATCH_NPZ
    [PAIR_JSON TORCH_NPZ] OUT_NPZ``: the locator's record of this backend's side of a model pair
    on one batch (dualtrain.core.locate; the TF side also takes the pair's map and the torch
    side's record)."""
    want = 5 if backend == "torch" else 7
    if len(argv) != want:
        print(
            f"usage: python -m dualtrain.backends.{backend}.tools probe-layers ...", file=sys.stderr
        )
        return 2
    try:
        spec = load_spec(argv[1])
        weights = load_weights(argv[2])
        with np.load(argv[3]) as z:
            inputs = [z[f"x{i}"] for i in range(len(spec.model.inputs))]
            y = z["y"]
        if backend == "torch":
            out = probe(spec, weights, inputs, y)
        else:
            layout = pair.Layout.from_json(json.loads(Path(argv[4]).read_text()))
            with np.load(argv[5]) as z:
                torch_side = {k: z[k] for k in z.files}
            out = probe(spec, weights, layout, inputs, y, torch_side)
    except UserError as exc:
        print(f"dualtrain: error: {exc}", file=sys.stderr)
        return 2
    np.savez(argv[-1], **out)
    return 0
