"""An export is loaded back before ``dualtrain export`` says it is done: in a fresh Python process
where dualtrain cannot be imported (an import finder refuses it), the way export.json says to load
it (``model.py``'s ``load()`` for torch, ``keras.saving.load_model`` for Keras), then called on a
batch of zeros of the model's input shapes, which must give (N, width) finite outputs.

A Keras model pair whose model.keras needs the user's own code (a custom layer or activation
defined in their module) cannot open with a bare ``load_model``: the check then loads it with the
user's module importable and imported (what registers their objects), and the export says exactly
those lines (export.json ``load``, and the CLI prints them). Anything else that does not load back
is the export's failure: one line, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dualtrain.core import pair
from dualtrain.errors import UserError
from dualtrain.spec import Experiment

#: runs in the fresh process: argv = fmt, folder, shapes (JSON), width, user module dir, module
_CHECK = r"""
import importlib, importlib.abc, importlib.util, json, os, sys
class _NoDualtrain(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dualtrain" or name.startswith("dualtrain."):
            raise ImportError("dualtrain is not importable in this check")
sys.meta_path.insert(0, _NoDualtrain())
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
fmt, folder, shapes, width, where, custom = sys.argv[1:7]
shapes, width, custom = json.loads(shapes), int(width), json.loads(custom)
if fmt == "torch":
    import torch
    path = os.path.join(folder, "model.py")
    spec = importlib.util.spec_from_file_location("exported_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = mod.load()
    dtype = next(net.parameters()).dtype
    with torch.no_grad():
        y = net(*[torch.zeros((2, *s), dtype=dtype) for s in shapes]).numpy()
else:
    import keras
    objects = None
    if custom:
        sys.path.insert(0, where)
        objects = {}
        for name, (module, attr) in custom.items():
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            objects[name] = obj
    net = keras.saving.load_model(os.path.join(folder, "model.keras"), custom_objects=objects)
    xs = [np.zeros((2, *s), "float32") for s in shapes]
    y = np.asarray(net(xs if len(xs) > 1 else xs[0], training=False))
assert y.shape == (2, width), f"output shape {y.shape}, expected (2, {width})"
assert np.isfinite(y).all(), "non-finite outputs on a batch of zeros"
print("loaded")
"""


def _shapes(spec: Experiment, fmt: str) -> list[list[int]]:
    """One sample's input shapes as the exported model takes them (Keras: images NHWC)."""
    out = []
    for i in spec.model.inputs:
        s = list(i.shape)
        out.append([s[1], s[2], s[0]] if fmt == "keras" and len(s) == 3 else s)
    return out


def _try(
    fmt: str,
    folder: Path,
    spec: Experiment,
    width: int,
    where: str = "",
    custom: dict | None = None,
) -> str:
    """'' when the export loads and runs, else the last line of what went wrong."""
    cmd = [sys.executable, "-c", _CHECK, fmt, str(folder), json.dumps(_shapes(spec, fmt))]
    cmd += [str(width), where, json.dumps(custom or {})]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=folder, timeout=300, env=_env()
        )
    except subprocess.TimeoutExpired:
        return "loading it back took over 300 s"
    if proc.returncode == 0 and proc.stdout.strip().endswith("loaded"):
        return ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def _env() -> dict[str, str]:
    """The user's environment without the source checkout dualtrain's workers get."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def load_back(fmt: str, folder: Path, spec: Experiment, width: int) -> str | None:
    """Load the export in ``folder`` back without dualtrain (module doc). None when it loads as
    export.json's conventions say; for a Keras pair that needs the user's module, the lines that
    load it (for export.json ``load``); a UserError when it does not load at all."""
    listed = folder / pair.CUSTOM_OBJECTS_FILE
    custom = json.loads(listed.read_text()) if listed.is_file() else {}
    listed.unlink(missing_ok=True)
    why = _try(fmt, folder, spec, width)
    if not why:
        return None
    name = "torch" if fmt == "torch" else "Keras"
    if custom and spec.model.path:
        where = str(Path(spec.model.path).expanduser().resolve())
        if not _try(fmt, folder, spec, width, where, custom):
            modules = sorted({m for m, _ in custom.values()})
            objects = ", ".join(f"{n!r}: {m}.{a}" for n, (m, a) in sorted(custom.items()))
            return (
                f"import sys; sys.path.insert(0, {where!r}); import {', '.join(modules)}; "
                f"keras.saving.load_model('model.keras', custom_objects={{{objects}}})"
            )
    raise UserError(
        f"the {name} export does not load back without dualtrain: {why}. Nothing was "
        f"written. Received: --format {fmt}"
    )
