"""``dualtrain export --format torch``: the run's inference model as plain torch.

``model.safetensors``: the state dict in torch's names (the canonical layout is torch's; batchnorm
layers get torch's ``num_batches_tracked``); ``model.py``: the nn.Module definition dualtrain built,
as plain torch code (``build_model()``, ``load()``), each layer's source from the layer registry
(``model.LAYERS``). Run by ``python -m dualtrain.backends.torch.tools export``.
"""

from __future__ import annotations

import inspect
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from dualtrain.backends.torch import tokens
from dualtrain.backends.torch.layers import Concat, MultiInput
from dualtrain.backends.torch.model import layer_source
from dualtrain.core.model import ResolvedLayer, resolve, walk
from dualtrain.core.pair.factories import import_factory
from dualtrain.core.weights import Weights
from dualtrain.spec import Experiment, LayerType

_HEADER = '''"""{model} exported by dualtrain from {run}.

A plain torch nn.Module (no dualtrain needed): ``load()`` builds it, loads model.safetensors and
puts it in eval mode. {inputs}; output: {output}. The inputs' normalisation is in export.json.
Dropout is torch's (identity in eval); batchnorm uses the run's statistics.
"""

from pathlib import Path

import torch
from torch import nn

DTYPE = torch.{dtype}
{tokens}


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


{classes}


def build_model() -> nn.Module:
    return {body}.to(DTYPE)


def load(path=Path(__file__).with_name("model.safetensors")) -> nn.Module:
    from safetensors.torch import load_file

    model = build_model()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
'''


#: dualtrain's own multi-input classes, as plain torch source in the exported model.py (their code
#: uses torch only; a change to them is exported as it is)
_MULTI_INPUT = "\n\n".join(
    inspect.getsource(c).replace("{", "{{").replace("}", "}}") for c in (Concat, MultiInput)
).rstrip()

#: the token layers (tokens.py uses torch only), exported as they are, when the model has them
_TOKENS = (
    inspect.getsource(tokens)
    .split("from torch import nn\n", 1)[1]
    .replace("{", "{{")
    .replace("}", "}}")
    .strip()
)


def _list(layers: Sequence[ResolvedLayer], indent: str) -> str:
    return "".join(f"\n{indent}    {layer_source(r, indent + '    ')}," for r in layers)


def torch_source(spec: Experiment, dtype: str, run: str) -> str:
    layers = resolve(spec.model)
    if len(spec.model.inputs) == 1:
        body = f"nn.Sequential({_list(layers, '        ')}\n    )"
    else:
        branches = "".join(
            f'\n            "{i.name}": [{_list(b, "            ")}\n            ],'
            for i, b in zip(spec.model.inputs, layers[0].branches, strict=True)
        )
        body = (
            f"MultiInput(\n        {{{branches}\n        }},\n        [{_list(layers, '        ')}"
            f"\n        ],\n    )"
        )
    inputs = "Inputs, in this order: " + ", ".join(
        f"{i.name} float32 (N, {', '.join(map(str, i.shape))})" for i in spec.model.inputs
    )
    output = f"(N, {layers[-1].out_shape[0]}) ({spec.model.loss.value} outputs: logits or values)"
    return _HEADER.format(
        model=spec.name,
        run=run,
        inputs=inputs,
        output=output,
        dtype=dtype,
        body=body,
        classes=_MULTI_INPUT,
        tokens=_token_source(layers),
    )


def _token_source(layers: list[ResolvedLayer]) -> str:
    """The token layers' classes (and the imports they need), for a model that has them."""
    if not any(r.spec.type in TOKEN_TYPES for r in walk(layers)):
        return ""
    return "import math\n\nimport torch.nn.functional as F\n\n\n" + _TOKENS + "\n"


TOKEN_TYPES = (
    LayerType.PATCHES,
    LayerType.POSITION,
    LayerType.ATTENTION,
    LayerType.TOKEN_POOL,
    LayerType.EMBEDDING,
)


def torch_state(spec: Experiment, weights: Weights) -> dict[str, np.ndarray]:
    """The canonical weights plus torch BatchNorm's ``num_batches_tracked`` (0: dualtrain's momentum
    is always a number, for which torch never reads it)."""
    state = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    for r in walk(resolve(spec.model)):
        if r.spec.type is LayerType.BATCHNORM:
            state[f"{r.prefix}.num_batches_tracked"] = np.zeros((), np.int64)
    return state


_PAIR = '''"""{model} exported by dualtrain from {run}: the torch side of a model pair,
{factory}(**ARGS) (the source file {source} is copied beside this one).

``load()`` builds the module, loads model.safetensors and puts it in eval mode (no dualtrain
needed). The inputs' normalisation is in export.json.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from {module} import {attr}  # noqa: E402

ARGS = {args!r}
DTYPE = torch.{dtype}


def build_model() -> torch.nn.Module:
    return {attr}(**ARGS).to(DTYPE)


def load(path=Path(__file__).with_name("model.safetensors")) -> torch.nn.Module:
    from safetensors.torch import load_file

    model = build_model()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
'''


def _local_modules(where: Path) -> list[Path]:
    """The top-level modules loaded from the folder ``where`` (the user's factory module and the
    ones it imports from beside it), which the exported model.py imports."""
    out = []
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and f.endswith(".py") and Path(f).resolve().parent == where.resolve():
            out.append(Path(f))
    return sorted(set(out))


def _export_pair(spec: Experiment, weights: Weights, folder: Path, dtype: str) -> None:
    """A model pair's torch side: its state dict, the file that defines the factory, and a
    model.py that builds and loads it."""
    assert spec.model.torch is not None
    module, _, attr = spec.model.torch.partition(":")
    factory = import_factory(spec.model.torch, spec.model.path, "model.torch")
    source = inspect.getsourcefile(factory)
    if source is not None and "." not in module:  # a top-level module: its file, and the files
        for path in _local_modules(Path(source).parent):  # of its folder it imported
            shutil.copy(path, folder / path.name)
    (folder / "model.py").write_text(
        _PAIR.format(
            model=spec.name,
            run=str(folder.parent),
            factory=spec.model.torch,
            source=Path(source).name if source else "?",
            module=module,
            attr=attr.split(".")[0],
            args=dict(spec.model.args),
            dtype=dtype,
        )
    )


def export_torch(spec: Experiment, weights: Weights, out: str, layout: Any = None) -> None:
    """Write model.safetensors and model.py into the folder ``out`` (dualtrain.driver.export)."""
    folder = Path(out)
    dtype = "float64" if next(iter(weights.values())).dtype == np.float64 else "float32"
    if spec.model.is_pair:
        state = {k: np.ascontiguousarray(v) for k, v in weights.items()}
        if layout is not None:  # BatchNorm's counter, as torch's state dict holds it (0)
            for a in layout.torch.torch:
                if a.kind == "batchnorm" and a.name.endswith(".running_mean"):
                    state[f"{a.module}.num_batches_tracked"] = np.zeros((), np.int64)
        save_file(state, str(folder / "model.safetensors"))
        _export_pair(spec, weights, folder, dtype)
        return
    save_file(torch_state(spec, weights), str(folder / "model.safetensors"))
    (folder / "model.py").write_text(torch_source(spec, dtype, str(folder.parent)))
