"""``dualtrain export``: a finished run's model in each framework's own form, usable without
dualtrain.

Each backend writes its own form in its own process (``python -m dualtrain.backends.<b>.tools
export``): ``--format torch`` (backends/torch/export.py): ``model.safetensors``, the state dict in
torch's names, and ``model.py``, the nn.Module definition dualtrain built, as plain torch code
(``build_model()``, ``load()``); ``--format keras`` (backends/tf/export.py): ``model.keras``, built
from Keras's own layers only, so ``keras.saving.load_model`` opens it without dualtrain.

Both are the inference model: dropout is the framework's own ``Dropout`` (identity in evaluation;
dualtrain's hashed training masks are not part of an exported model) and batchnorm normalises with
the run's running statistics. Inputs: the model's inputs in their order, normalised as the run
normalised them (data.json: MNIST's ``(x / 255 - 0.1307) / 0.3081``, or the mean and std per
channel or feature), images (N, C, H, W) for torch and (N, H, W, C) for Keras; outputs: the last
layer's (N, width) (logits, or values for mse and huber: the loss's declared outputs).
``export.json`` records the source run, the spec and these conventions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from dualtrain.backends import check_installed, parse_backend, tools_warm
from dualtrain.core import pair
from dualtrain.core.data.dataset import read_record
from dualtrain.core.losses import LOSSES
from dualtrain.core.model import output_width
from dualtrain.core.weights import check_layout, load_weights
from dualtrain.driver.export_check import load_back
from dualtrain.driver.outdir import check_creatable
from dualtrain.errors import UserError
from dualtrain.launch import forkserver
from dualtrain.launch.child import worker_env
from dualtrain.records.record import (
    SPEC_FILE,
    SUMMARY_FILE,
    WEIGHTS_BEST,
    WEIGHTS_EMA,
    WEIGHTS_FINAL,
)
from dualtrain.runtime.entry import run_spec

FORMATS = ("torch", "keras")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_modes(folder: Path) -> None:
    """What the user's umask gives new files and folders: safetensors writes its file 0600 and
    mkdtemp makes the folder 0700, so an export would be private by accident."""
    mask = _umask()
    folder.chmod(0o777 & ~mask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)


def _inputs(spec, run_dir: Path, fmt: str) -> list[dict]:
    """Each model input as the exported model takes it: name, layout, normalisation."""
    record = read_record(run_dir) or {}
    norm = record.get("normalize") or {}
    out = []
    for i in spec.model.inputs:
        dims = list(i.shape)
        if len(dims) == 3:
            layout = (
                f"NCHW (N, {', '.join(map(str, dims))})"
                if fmt == "torch"
                else (f"NHWC (N, {dims[1]}, {dims[2]}, {dims[0]})")
            )
        else:
            layout = f"(N, {dims[0]})"
        n = norm.get(i.name)
        if n is None and spec.data.dataset.value == "mnist" and i.name not in norm:
            n = {"scale": 255.0, "mean": [0.1307], "std": [0.3081]}  # runs before data.json
        rule = (
            "none (the stored values as float32)"
            if n is None
            else ("(x / scale - mean) / std" if "scale" in n else "(x - mean) / std")
            + ", per channel (images) or feature (tables)"
        )
        out.append({"name": i.name, "layout": layout, "normalise": rule, **(n or {})})
    return out


#: --weights: which of a finished run's weight files an export takes
WEIGHT_FILES = {"final": WEIGHTS_FINAL, "best": WEIGHTS_BEST, "ema": WEIGHTS_EMA}


def export_run(
    run_dir: str | Path,
    fmt: str,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    which: str = "final",
) -> Path:
    """Export the finished run in ``run_dir``; returns the folder written. ``overwrite``: replace a
    previous export in ``out`` (a folder holding export.json), nothing else. ``which``: the run's
    final weights, or its best (train.keep_best)."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {list(FORMATS)}. Received: {fmt!r}")
    # Each format is written by its framework (as its reader needs it): installed, or one line.
    check_installed(parse_backend(BACKEND_OF[fmt]))
    run_dir = Path(run_dir)
    if not (run_dir / SPEC_FILE).is_file():
        raise UserError(f"{run_dir} is not a dualtrain run directory (no {SPEC_FILE})")
    if not (run_dir / WEIGHTS_FINAL).is_file() or not (run_dir / SUMMARY_FILE).is_file():
        raise UserError(f"{run_dir} has not finished (no {WEIGHTS_FINAL}); export a finished run")
    if which not in WEIGHT_FILES:
        raise UserError(f"--weights must be one of {list(WEIGHT_FILES)}. Received: {which!r}")
    source = run_dir / WEIGHT_FILES[which]
    if not source.is_file():
        raise UserError(
            f"{run_dir} has no {source.name}: --weights best needs a run with train.keep_best "
            f"(and an evaluation that improved), --weights ema one with train.ema. Received: "
            f"--weights {which}"
        )
    spec = run_spec(run_dir)
    weights = load_weights(source)
    check_layout(weights, spec.model, source=str(source))
    target, replace = _export_target(run_dir, fmt, out, overwrite)
    check_creatable(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # A folder of our own beside the target: nothing of the user's is ever deleted, a failed
        # export leaves nothing behind, and the target appears complete or not at all.
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise UserError(
            f"cannot write the export into {str(target.parent)!r}: {exc.strerror}. "
            f"Received: {str(target)!r}"
        ) from None
    try:
        _write(fmt, run_dir, tmp, source)
        meta = {
            "format": fmt,
            "source_run": str(run_dir.resolve()),
            "weights": source.name,
            "spec": spec.to_dict(),
            "dtype": str(next(iter(weights.values())).dtype),
            "inputs": _inputs(spec, run_dir, fmt),
            "output": f"(N, {_width(spec, run_dir)}): " + LOSSES[spec.model.loss].outputs,
            # a table's text target: output i is class_names[i]
            "class_names": ((read_record(run_dir) or {}).get("table") or {}).get("class_names"),
        }
        # loaded back in a fresh process without dualtrain before it is reported done
        how = load_back(fmt, tmp, spec, _width(spec, run_dir))
        if how is not None:
            meta["load"] = how
        (tmp / "export.json").write_text(json.dumps(meta, indent=2) + "\n")
        _publish_modes(tmp)
        _put_in_place(tmp, target, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _export_target(
    run_dir: Path, fmt: str, out: str | Path | None, overwrite: bool
) -> tuple[Path, bool]:
    """The folder the export goes to, checked, and whether it replaces a previous export there."""
    target = Path(out) if out is not None else run_dir / "export" / fmt
    if target.exists() and not target.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(target)!r}")
    replace = False
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise UserError(
                f"--out is not empty; choose another folder, or --overwrite to replace "
                f"a previous export there. Received: {str(target)!r}"
            )
        if not (target / "export.json").is_file():
            raise UserError(
                f"--overwrite replaces a previous export only (a folder with "
                f"export.json); {str(target)!r} holds something else. Received: "
                f"{str(target)!r}"
            )
        replace = True
    return target, replace


def _put_in_place(tmp: Path, target: Path, replace: bool) -> None:
    """The finished export (in ``tmp``, beside the target) becomes the target folder."""
    if replace:  # the previous export (checked above: ours) goes only once the new one is whole
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        old.rmdir()
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if target.exists():
            target.rmdir()  # empty (checked above)
        tmp.rename(target)


# ---- each backend writes its own form, in its own process ------------------------------------

#: --format -> the backend that writes it
BACKEND_OF = {"torch": "torch", "keras": "tf"}


def _width(spec, run_dir: Path) -> int:
    if spec.model.is_pair:  # the pair's recorded output
        layout = pair.read(run_dir)
        if layout is None:
            raise UserError(f"{run_dir} has no {pair.PAIR_FILE} (a model pair's map)")
        return layout.output_width
    return output_width(spec.model)


def _write(fmt: str, run_dir: Path, folder: Path, source: Path) -> None:
    backend = BACKEND_OF[fmt]
    proc = forkserver.run(
        f"dualtrain.backends.{backend}.tools",
        ["export", str(run_dir / SPEC_FILE), str(source), str(folder)],
        env=worker_env({}),
        warm=tools_warm(parse_backend(backend)),
    )
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        name = "torch" if fmt == "torch" else "Keras"
        raise UserError(f"the {name} export failed: {lines[-1] if lines else 'no output'}")
