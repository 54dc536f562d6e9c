"""Where the run's data comes from (MNIST, your arrays, a bundled dataset), the stored arrays
read by key (``x_train``, ``y_test``, ...), and their shapes and row counts checked against the
model's inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualtrain.core import arrays as arrays_mod
from dualtrain.core import bundled, mnist
from dualtrain.errors import UserError
from dualtrain.spec import Dataset, Experiment, ModelSpec


def input_names(spec: Experiment) -> tuple[tuple[str, ...], str]:
    inputs = tuple(i.name for i in spec.model.inputs)
    if spec.data.dataset is not Dataset.ARRAYS:
        if inputs != ("x",):
            raise UserError(
                f"data.dataset {spec.data.dataset.value} has one input, named x; model.inputs "
                f"names {list(inputs)}. Received: model.inputs"
            )
        if spec.data.dataset is Dataset.MNIST and spec.model.inputs[0].shape != (1, 28, 28):
            raise UserError(
                "data.dataset mnist gives (1, 28, 28) images: model.inputs[x].shape must be "
                f"[1, 28, 28]. Received: {list(spec.model.inputs[0].shape)}"
            )
        return inputs, "y"
    return inputs, spec.data.target


def locate(spec: Experiment) -> str:
    """Where the data comes from (cheap: no decoding), or a UserError."""
    d = spec.data
    if d.dataset is Dataset.MNIST:
        return mnist.locate(d)
    if d.dataset is Dataset.ARRAYS:
        assert d.path is not None  # DataSpec requires it
        if not Path(d.path).expanduser().exists():
            raise UserError(f"data.path does not exist. Received: {d.path!r}")
        return f"arrays:{d.path}"
    return f"bundled:{d.dataset.value}"


def read_stored(spec: Experiment, source: str) -> dict[str, np.ndarray]:
    inputs, target = input_names(spec)
    kind, _, where = source.partition(":")
    if kind == "bundled":
        return arrays_mod.read(bundled.path(where), arrays_mod.keys(inputs, target))
    if kind == "arrays":
        return arrays_mod.read(where, arrays_mod.keys(inputs, target))
    raw = mnist.read_source(source)
    return {
        "x_train": raw["train_images"],
        "y_train": raw["train_labels"],
        "x_test": raw["test_images"],
        "y_test": raw["test_labels"],
    }


def check_shapes(model: ModelSpec, stored: dict[str, np.ndarray], target: str, where: str) -> None:
    for split in ("train", "test"):
        n = len(stored[f"{target}_{split}"])
        for i in model.inputs:
            key = f"{i.name}_{split}"
            a = stored[key]
            want = i.shape
            got = tuple(a.shape[1:])
            ok = got == want or (len(want) == 3 and want[0] == 1 and got == want[1:])
            if not ok:
                raise UserError(
                    f"{where}: {key} has samples of shape {list(got)}, model.inputs[{i.name}] "
                    f"says {list(want)} (images are (N, C, H, W); (N, H, W) for one channel). "
                    f"Received: {key} {list(a.shape)}"
                )
            if len(a) != n:
                raise UserError(
                    f"{where}: {key} has {len(a)} rows but {target}_{split} has {n}: every input "
                    f"and the target need one row per sample. Received: {len(a)} != {n}"
                )
