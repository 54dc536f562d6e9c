"""``dualtrain export``: a finished run's model in each framework's own form, usable without dualtrain.

``--format torch`` (written here, framework-free): ``model.safetensors``, the state dict in torch's
names (the canonical layout is torch's; batchnorm layers get torch's ``num_batches_tracked``), and
``model.py``, the nn.Module definition dualtrain built, as plain torch code (``build_model()``,
``load()``). ``--format keras`` (written by the tf backend in its own process): ``model.keras``, built
from Keras's own layers only, so ``keras.saving.load_model`` opens it without dualtrain.

Both are the inference model: dropout is the framework's own ``Dropout`` (identity in evaluation;
dualtrain's hashed training masks are not part of an exported model) and batchnorm normalises with
the run's running statistics. Inputs: MNIST images normalised as ``(x / 255 - 0.1307) / 0.3081``,
(N, 1, 28, 28) for torch, (N, 28, 28, 1) for Keras; outputs: logits (N, 10).
``export.json`` records the source run, the spec and these conventions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from dualtrain.core.data import MEAN, STD
from dualtrain.core.model import ResolvedLayer, resolve, walk
from dualtrain.core.weights import Weights, check_layout, load_weights
from dualtrain.driver.outdir import check_creatable
from dualtrain.errors import UserError
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_FINAL
from dualtrain.spec import Experiment, LayerType, Padding

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


def export_run(run_dir: str | Path, fmt: str, out: str | Path | None = None, *,
               overwrite: bool = False) -> Path:
    """Export the finished run in ``run_dir``; returns the folder written. ``overwrite``: replace a
    previous export in ``out`` (a folder holding export.json), nothing else."""
    from dualtrain.runtime.entry import run_spec

    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {list(FORMATS)}. Received: {fmt!r}")
    run_dir = Path(run_dir)
    if not (run_dir / SPEC_FILE).is_file():
        raise UserError(f"{run_dir} is not a dualtrain run directory (no {SPEC_FILE})")
    if not (run_dir / WEIGHTS_FINAL).is_file() or not (run_dir / SUMMARY_FILE).is_file():
        raise UserError(f"{run_dir} has not finished (no {WEIGHTS_FINAL}); export a finished run")
    spec = run_spec(run_dir)
    weights = load_weights(run_dir / WEIGHTS_FINAL)
    check_layout(weights, spec.model, source=str(run_dir / WEIGHTS_FINAL))
    target = Path(out) if out is not None else run_dir / "export" / fmt
    if target.exists() and not target.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(target)!r}")
    replace = False
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise UserError(f"--out is not empty; choose another folder, or --overwrite to replace "
                            f"a previous export there. Received: {str(target)!r}")
        if not (target / "export.json").is_file():
            raise UserError(f"--overwrite replaces a previous export only (a folder with "
                            f"export.json); {str(target)!r} holds something else. Received: "
                            f"{str(target)!r}")
        replace = True
    check_creatable(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # A folder of our own beside the target: nothing of the user's is ever deleted, a failed
        # export leaves nothing behind, and the target appears complete or not at all.
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise UserError(f"cannot write the export into {str(target.parent)!r}: {exc.strerror}. "
                        f"Received: {str(target)!r}") from None
    try:
        if fmt == "torch":
            _write_torch(spec, weights, tmp)
        else:
            _write_keras(run_dir, tmp)
        meta = {"format": fmt, "source_run": str(run_dir.resolve()), "spec": spec.to_dict(),
                "dtype": str(next(iter(weights.values())).dtype),
                "input": {"normalise": f"(x / 255 - {MEAN}) / {STD}",
                          "layout": "NCHW (N, 1, 28, 28)" if fmt == "torch" else "NHWC (N, 28, 28, 1)"},
                "output": "logits (N, 10)"}
        (tmp / "export.json").write_text(json.dumps(meta, indent=2) + "\n")
        _publish_modes(tmp)
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ---- torch ---------------------------------------------------------------------------------------

_HEADER = '''"""{model} exported by dualtrain from {run}.

A plain torch nn.Module (no dualtrain needed): ``load()`` builds it, loads model.safetensors and
puts it in eval mode. Input: float32 (N, 1, 28, 28), normalised as (x / 255 - {mean}) / {std};
output: logits (N, 10). Dropout is torch's (identity in eval); batchnorm uses the run's statistics.
"""

from pathlib import Path

import torch
from torch import nn

DTYPE = torch.{dtype}


class Residual(nn.Module):
    """body(x) + shortcut(x); an empty shortcut is the identity."""

    def __init__(self, body, shortcut):
        super().__init__()
        self.body = nn.Sequential(*body)
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W."""

    def forward(self, x):
        return x.mean(dim=(2, 3))


def build_model() -> nn.Sequential:
    return nn.Sequential(
{layers}
    ).to(DTYPE)


def load(path=Path(__file__).with_name("model.safetensors")) -> nn.Sequential:
    from safetensors.torch import load_file

    model = build_model()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
'''

_ACT = {LayerType.RELU: "nn.ReLU()", LayerType.TANH: "nn.Tanh()", LayerType.SIGMOID: "nn.Sigmoid()",
        LayerType.GELU: "nn.GELU()"}


def _torch_layer(r: ResolvedLayer, indent: str) -> str:
    s, t = r.spec, r.spec.type
    if t is LayerType.DENSE:
        return f"nn.Linear({r.in_shape[0]}, {s.units}, bias={s.bias})"
    if t is LayerType.CONV2D:
        pad = '"same"' if s.padding is Padding.SAME else (s.padding if isinstance(s.padding, int) else 0)
        return (f"nn.Conv2d({r.in_shape[0]}, {s.filters}, {s.kernel_size}, stride={s.stride or 1}, "
                f"padding={pad}, bias={s.bias})")
    if t is LayerType.MAXPOOL2D:
        return f"nn.MaxPool2d({s.pool_size}, stride={s.stride or s.pool_size})"
    if t is LayerType.AVGPOOL2D:
        return f"nn.AvgPool2d({s.pool_size}, stride={s.stride or s.pool_size})"
    if t is LayerType.GLOBAL_AVGPOOL:
        return "GlobalAvgPool()"
    if t is LayerType.FLATTEN:
        return "nn.Flatten()"
    if t is LayerType.DROPOUT:
        return f"nn.Dropout({s.rate})"
    if t is LayerType.BATCHNORM:
        kind = "1d" if len(r.in_shape) == 1 else "2d"
        return f"nn.BatchNorm{kind}({r.in_shape[0]}, eps={s.eps}, momentum={s.momentum})"
    if t is LayerType.RESIDUAL:
        inner = indent + "    "

        def block(layers):
            return "".join(f"\n{inner}    {_torch_layer(x, inner + '    ')}," for x in layers)

        return (f"Residual(\n{inner}[{block(r.body)}\n{inner}],\n{inner}[{block(r.shortcut)}\n{inner}],"
                f"\n{indent})")
    return _ACT[t]


def torch_source(spec: Experiment, dtype: str, run: str) -> str:
    layers = "\n".join(f"        {_torch_layer(r, '        ')}," for r in resolve(spec.model))
    return _HEADER.format(model=spec.name, run=run, mean=MEAN, std=STD, dtype=dtype, layers=layers)


def torch_state(spec: Experiment, weights: Weights) -> dict[str, np.ndarray]:
    """The canonical weights plus torch BatchNorm's ``num_batches_tracked`` (0: dualtrain's momentum is
    always a number, for which torch never reads it)."""
    state = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    for r in walk(resolve(spec.model)):
        if r.spec.type is LayerType.BATCHNORM:
            state[f"{r.prefix}.num_batches_tracked"] = np.zeros((), np.int64)
    return state


def _write_torch(spec: Experiment, weights: Weights, folder: Path) -> None:
    from safetensors.numpy import save_file

    dtype = "float64" if next(iter(weights.values())).dtype == np.float64 else "float32"
    save_file(torch_state(spec, weights), str(folder / "model.safetensors"))
    (folder / "model.py").write_text(torch_source(spec, dtype, str(folder.parent)))


# ---- keras (in the tf backend's own process) -----------------------------------------------------

def _write_keras(run_dir: Path, folder: Path) -> None:
    from dualtrain.launch.local import worker_env

    cmd = [sys.executable, "-m", "dualtrain.backends.tf.tools", "export", str(run_dir / SPEC_FILE),
           str(run_dir / WEIGHTS_FINAL), str(folder / "model.keras")]
    proc = subprocess.run(cmd, env=worker_env({}), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise UserError(f"the Keras export failed: {lines[-1] if lines else 'no output'}")
