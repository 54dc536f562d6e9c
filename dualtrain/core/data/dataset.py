"""The :class:`Data` a run reads its steps from: the stored arrays, the splits and the inputs'
transforms, opened from the spec (:func:`open_data`); and what the driver records about it in the
run directory (data.json: sizes, validation ids, the normalisation statistics workers read back).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import arrays as arrays_mod
from dualtrain.core.data.sources import (
    check_shapes,
    input_names,
    locate,
    read_stored,
    stored_target,
)
from dualtrain.core.data.splits import TEST, TRAIN, VALIDATION, Split, make_splits
from dualtrain.core.data.transforms import Transform, input_transforms
from dualtrain.core.losses import LOSSES
from dualtrain.spec import Dataset, DataSpec, Experiment, Loss, ModelSpec

#: what the driver records about the data in the run directory (workers read the statistics)
DATA_FILE = "data.json"


@dataclass(frozen=True)
class Data:
    spec: DataSpec
    model: ModelSpec
    stored: dict[str, np.ndarray]
    """The stored arrays by key (``x_train``, ...), memory-mapped for .npy folders."""
    splits: dict[str, Split]
    transforms: tuple[Transform | None, ...]
    """Per model input; None: the stored values as float32 (normalize: none)."""
    source: str
    sha256: str = ""
    """Content digest (filled in where it was computed: the driver, checks)."""
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def loss(self) -> Loss:
        return self.model.loss

    def size(self, split: str) -> int:
        return len(self.splits[split]) if split in self.splits else 0

    def _rows(self, split: str, positions: np.ndarray | slice) -> np.ndarray | slice:
        s = self.splits[split]
        if isinstance(positions, slice):
            if s.contiguous:
                return positions
            return s.rows[positions]
        return s.rows[np.asarray(positions, dtype=np.int64)]

    def _stored_split(self, split: str) -> str:
        return TEST if split == TEST else TRAIN

    def inputs(self, split: str, positions: np.ndarray | slice) -> list[np.ndarray]:
        """The model inputs of these samples, float32, shaped (n, *input shape): the stored rows,
        normalised as they are taken. The transform is element-wise, so a row gets the same float32
        values whatever batch it comes in; normalising only what a step or an evaluation chunk
        reads keeps a run's start-up free of it (normalising all of MNIST up front cost each worker
        ~0.4 s per split, before a one-step run trained at all)."""
        rows = self._rows(split, positions)
        src = self._stored_split(split)
        out = []
        for spec, t in zip(self.model.inputs, self.transforms, strict=True):
            a = arrays_mod.take(self.stored[f"{spec.name}_{src}"], rows)
            a = a.reshape(a.shape[0], *spec.shape)
            out.append(t.apply(a) if t is not None else a.astype(np.float32))
        return out

    def targets(self, split: str, positions: np.ndarray | slice) -> np.ndarray:
        """int64 labels (n,) for a loss of class labels (cross-entropy); float32 (n, T) for the
        other losses."""
        rows = self._rows(split, positions)
        a = arrays_mod.take(self.stored[f"{self.target_name}_{self._stored_split(split)}"], rows)
        if LOSSES[self.loss].labels:
            return a.astype(np.int64)
        cols = int(np.prod(a.shape[1:], dtype=np.int64))  # 1 for (N,) targets
        return a.astype(np.float32).reshape(a.shape[0], cols)

    @property
    def target_name(self) -> str:
        """The key the target's arrays are stored under (``y``, or data.target for arrays)."""
        return stored_target(self.spec, tuple(i.name for i in self.model.inputs))

    @property
    def class_names(self) -> list[str] | None:
        """A table's class names, class i first (its target was text or a categorical)."""
        table = self.facts.get("table")
        return None if table is None else table.get("class_names")

    def record(self) -> dict[str, Any]:
        val = self.splits.get(VALIDATION)
        return {
            "dataset": self.spec.dataset.value,
            "source": self.source,
            "sha256": self.sha256,
            "sizes": {k: len(v) for k, v in self.splits.items()},
            "validation_ids": [] if val is None else [int(i) for i in val.rows],
            "validation_ids_sha256": "" if val is None else ids_digest(val.rows),
            "normalize": {
                i.name: (t.record() if t is not None else None)
                for i, t in zip(self.model.inputs, self.transforms, strict=True)
            },
            **self.facts,
        }


def ids_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()


def open_data(spec: Experiment, run_dir: Path | None = None) -> Data:
    """The run's data (no content checks: :func:`check` runs those once, in the driver). With a
    ``run_dir`` whose data.json the driver wrote, the statistics are read from it, not computed
    again."""
    source = locate(spec)
    stored, facts = read_stored(spec, source)
    inputs, target = input_names(spec)
    splits = make_splits(spec, len(stored[f"{target}_train"]), len(stored[f"{target}_test"]))
    record = read_record(run_dir) if run_dir is not None else None
    recorded = record.get("normalize") if record else None
    if spec.data.dataset is not Dataset.MNIST:  # before the statistics, which reshape rows
        columns = facts["table"]["inputs"] if "table" in facts else None
        check_shapes(spec.model, stored, target, where_of(source), columns)
    return Data(
        spec=spec.data,
        model=spec.model,
        stored=stored,
        splits=splits,
        transforms=input_transforms(spec, stored, splits, recorded),
        source=source,
        sha256=record.get("sha256", "") if record else "",
        facts=facts,
    )


def where_of(source: str) -> str:
    """How an error names the data: your file or folder as given, else the source."""
    kind, _, where = source.partition(":")
    return where if kind in ("arrays", "table") else source


def write_record(data: Data, run_dir: Path) -> None:
    (Path(run_dir) / DATA_FILE).write_text(json.dumps(data.record(), indent=1) + "\n")


def read_record(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / DATA_FILE
    return json.loads(p.read_text()) if p.is_file() else None
