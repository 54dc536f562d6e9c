"""A model pair's layout for a run (dualtrain.core.pair): each backend describes its own side in a
child process (the driver imports neither framework), both at once; the map is made here, once
per process and spec, and written into the run directory with the initial weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dualtrain.backends import PACKAGES, check_installed, tools_warm
from dualtrain.core import pair
from dualtrain.core.pair.precheck import precheck
from dualtrain.core.weights import Weights, check_shapes, load_weights
from dualtrain.driver import pair_cache
from dualtrain.errors import UserError
from dualtrain.launch import forkserver
from dualtrain.spec import Backend, Experiment
from dualtrain.spec.load import dump_spec

_LAYOUTS: dict[str, tuple[pair.Layout, Weights]] = {}
TIMEOUT_S = 600


def _key(spec: Experiment) -> str:
    return repr((spec.model, spec.seed, os.getcwd()))


def pair_layout(spec: Experiment) -> tuple[pair.Layout, Weights]:
    """The run's map and initial weights (the torch module's own, or model.init_from's)."""
    key = _key(spec)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _describe(spec)
    return _LAYOUTS[key]


def _describe(spec: Experiment) -> tuple[pair.Layout, Weights]:
    precheck(spec.model)  # the mistakes that need no framework, before one loads
    if spec.model.weight_map is not None:  # a malformed map: before the frameworks load
        pair.read_map_file(spec.model.weight_map)
    for backend in (Backend.TORCH, Backend.TF):
        check_installed(backend)  # a pair needs both frameworks, whichever runs
    with tempfile.TemporaryDirectory(prefix="dualtrain-pair-") as tmp:
        cached = pair_cache.key(spec)
        if not pair_cache.fetch(cached, Path(tmp), spec):
            spec_path = Path(tmp) / "spec.yaml"
            spec_path.write_text(dump_spec(spec))
            if spec.model.convert:  # the torch side runs the converter; the TF side needs its port
                _run_children(spec, spec_path, (Backend.TORCH,))
                _run_children(spec, spec_path, (Backend.TF,))
            else:
                _run_children(spec, spec_path, (Backend.TORCH, Backend.TF))
            pair_cache.store(cached, Path(tmp), spec)
        sides = {
            b: pair.side_from_json(json.loads((Path(tmp) / b.value / "side.json").read_text()))
            for b in (Backend.TORCH, Backend.TF)
        }
        weights = load_weights(Path(tmp) / Backend.TORCH.value / "weights.npz")
        learned = None
        if spec.model.convert:
            converted = Path(tmp) / Backend.TORCH.value / pair.CONVERTED_FILE
            learned = pair.map_from_json(json.loads(converted.read_text())["map"])
    return _layout(spec, sides, weights, learned)


def _run_children(spec: Experiment, spec_path: Path, backends: tuple[Backend, ...]) -> None:
    """Each backend's describe child (the torch side's ``convert`` for a converted pair), all at
    once, writing into ``tmp``/torch and ``tmp``/tf; a child that fails is one line (its own, or
    the user's traceback and its last line)."""
    tmp = spec_path.parent
    converted = tmp / Backend.TORCH.value / pair.CONVERTED_FILE
    procs = {}
    for backend in backends:
        out = tmp / backend.value
        out.mkdir()
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        command = "convert" if spec.model.convert and backend is Backend.TORCH else "describe"
        extra = [str(converted)] if spec.model.convert and backend is Backend.TF else []
        procs[backend] = forkserver.popen(
            f"{PACKAGES[backend]}.tools",
            [command, str(spec_path), str(out), *extra],
            env=env,
            warm=tools_warm(backend),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    for backend, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            field = "model.torch" if backend is Backend.TORCH else spec.model.keras_side
            raise UserError(
                f"{field.partition('=')[0]}: building the model took over {TIMEOUT_S} s. "
                f"Received: {field}"
            ) from None
        field, given = _field(spec, backend)
        if proc.returncode != 0:
            for p in procs.values():
                p.kill()
            lines = [ln for ln in err.splitlines() if ln.strip()]
            ours = [ln for ln in lines if ln.startswith("dualtrain: error: ")]
            if proc.returncode == 2 and ours:
                raise UserError(ours[-1].removeprefix("dualtrain: error: "))
            # the user's own code raised: its traceback is theirs to read
            sys.stderr.write("\n".join(lines[-30:]) + "\n")
            last = lines[-1] if lines else f"exit code {proc.returncode}"
            raise UserError(
                f"{field}: building or running the model raised (its traceback above): "
                f"{last}. Received: {field}={given!r}"
            )


def _field(spec: Experiment, backend: Backend) -> tuple[str, str | None]:
    """The spec field that builds ``backend``'s side, and its value (a converted pair's torch
    child runs model.convert too)."""
    m = spec.model
    if backend is Backend.TORCH:
        return ("model.torch or model.convert", m.torch) if m.convert else ("model.torch", m.torch)
    return ("model.convert", m.convert) if m.convert else ("model.keras", m.keras)


def _layout(
    spec: Experiment,
    sides: dict[Backend, pair.Side],
    weights: Weights,
    learned: tuple[pair.MapEntry, ...] | None = None,
) -> tuple[pair.Layout, Weights]:
    """The map of the two described sides (``learned``: a converted pair's), the initial weights
    (model.init_from's, if given)."""
    layout = pair.layout(sides[Backend.TORCH], sides[Backend.TF], spec.model.weight_map, learned)
    if spec.model.init_from is not None:
        weights = load_weights(spec.model.init_from)
        check_shapes(weights, layout.shapes(), source=spec.model.init_from)
    out_t, out_k = layout.torch.output, layout.keras.output
    if out_t != out_k:
        raise UserError(
            f"model pair: the torch model outputs {list(out_t)} per sample and the Keras one "
            f"{list(out_k)}. Received: {spec.model.torch} vs {spec.model.keras_side}"
        )
    return layout, weights
