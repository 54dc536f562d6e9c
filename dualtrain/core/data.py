"""The run's data, whatever its source, as both backends consume it (docs/data.md).

:func:`open_data` gives a :class:`Data`: three splits (train, an optional validation split taken
from the training rows by ids, test), each a list of row ids into the stored arrays (memory-mapped
where they are .npy files), and one :class:`Transform` per input. A step asks for its rows
(:meth:`Data.inputs`, :meth:`Data.targets`): the same ids give the same float32 arrays on both
backends, computed here once, so neither framework normalises or casts anything itself (fp64 runs
widen these float32 values exactly).

Sources: MNIST (:mod:`.mnist`, content pinned), your arrays (:mod:`.arrays`), scikit-learn's
bundled datasets (:mod:`.bundled`, content pinned). The sample ids the plan deals in are
positions in the training split: with no validation split and no limit they are the rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core import arrays as arrays_mod
from dualtrain.core import bundled, mnist
from dualtrain.core.losses import LOSSES
from dualtrain.core.model import output_width
from dualtrain.core.plan import torch_randperm
from dualtrain.errors import UserError
from dualtrain.spec import Dataset, DataSpec, Experiment, Loss, ModelSpec, Normalize

TRAIN, VALIDATION, TEST = "train", "validation", "test"
#: what the driver records about the data in the run directory (workers read the statistics)
DATA_FILE = "data.json"


@dataclass(frozen=True)
class Transform:
    """One input's normalisation, in float32: ``((x as float32) / scale - mean) / std`` per channel
    (images) or feature (tables); ``scale`` is MNIST's 255 (None elsewhere)."""

    mean: np.ndarray
    std: np.ndarray
    scale: float | None = None

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == np.uint8 and x.ndim == self.mean.ndim + 1:
            # 8-bit inputs (images): each channel's 256 results looked up, one pass instead of four
            # (a step's batch, an evaluation chunk); the table is this same formula on 0..255
            lut = self._table()
            if lut.shape[0] == 1:
                return lut[0][x]
            return lut[np.arange(lut.shape[0]).reshape(-1, *([1] * (x.ndim - 2))), x]
        return self._formula(x)

    def _formula(self, x: np.ndarray) -> np.ndarray:
        y = x.astype(np.float32)
        if self.scale is not None:
            y = y / np.float32(self.scale)
        return (y - self.mean) / self.std

    def _table(self) -> np.ndarray:
        """(channels, 256): the formula's float32 result for every uint8 value of every channel,
        computed by :meth:`_formula` itself (so a lookup gives the same bits)."""
        cached = self.__dict__.get("_lut")
        if cached is None:
            c = self.mean.shape[0]
            grid = np.broadcast_to(
                np.arange(256, dtype=np.uint8).reshape(256, *([1] * self.mean.ndim)),
                (256, c, *([1] * (self.mean.ndim - 1))),
            )
            cached = np.ascontiguousarray(self._formula(grid).reshape(256, c).T)
            object.__setattr__(self, "_lut", cached)  # a frozen dataclass: computed once
        return cached

    def record(self) -> dict[str, Any]:
        return {
            "mean": [float(v) for v in self.mean.ravel()],
            "std": [float(v) for v in self.std.ravel()],
            **({"scale": self.scale} if self.scale is not None else {}),
        }


@dataclass(frozen=True)
class Split:
    rows: np.ndarray
    """Row ids (int64) into the stored arrays, in the order the split numbers its samples."""
    contiguous: bool = False
    """rows are 0..n-1 (a slice reads them)."""

    def __len__(self) -> int:
        return len(self.rows)


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
        """int64 labels (n,) for cross-entropy; float32 (n, T) for the other losses."""
        rows = self._rows(split, positions)
        a = arrays_mod.take(self.stored[f"{self.target_name}_{self._stored_split(split)}"], rows)
        if self.loss is Loss.CROSS_ENTROPY:
            return a.astype(np.int64)
        cols = int(np.prod(a.shape[1:], dtype=np.int64))  # 1 for (N,) targets
        return a.astype(np.float32).reshape(a.shape[0], cols)

    @property
    def target_name(self) -> str:
        return "y" if self.spec.dataset is not Dataset.ARRAYS else self.spec.target

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


# ---- opening ----------------------------------------------------------------------------------


def _names(spec: Experiment) -> tuple[tuple[str, ...], str]:
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


def _stored(spec: Experiment, source: str) -> dict[str, np.ndarray]:
    inputs, target = _names(spec)
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


def _validation_rows(d: DataSpec, n: int, seed: int) -> np.ndarray | None:
    if d.validation_ids:
        ids = np.asarray(sorted(d.validation_ids), dtype=np.int64)
        if ids[-1] >= n:
            raise UserError(
                f"data.validation_ids must be rows of the training split (< {n}). Received: "
                f"{int(ids[-1])}"
            )
        return ids
    if d.validation is None:
        return None
    k = int(round(d.validation * n))
    if not 1 <= k < n:
        raise UserError(
            f"data.validation {d.validation} of {n} training samples leaves "
            f"{'no validation' if k < 1 else 'no training'} sample. Received: {d.validation}"
        )
    return np.sort(torch_randperm(n, validation_seed(seed))[:k])


def validation_seed(seed: int) -> int:
    """The seed of the validation permutation (``torch.randperm(n, generator=manual_seed(it))``
    takes its first k ids): derived from the run's seed, apart from the epochs' shuffles."""
    digest = hashlib.sha256(f"dualtrain validation {seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _splits(spec: Experiment, n_train_all: int, n_test_all: int) -> dict[str, Split]:
    d = spec.data
    for name, limit, size in (
        ("train_limit", d.train_limit, n_train_all),
        ("test_limit", d.test_limit, n_test_all),
    ):
        if limit is not None and limit > size:
            raise UserError(
                f"data.{name} must be <= {size} (the {name.split('_')[0]} split's size). "
                f"Received: {limit}"
            )
    n = d.train_limit or n_train_all
    n_test = d.test_limit or n_test_all
    val = _validation_rows(d, n, spec.seed)
    out: dict[str, Split] = {}
    if val is None:
        out[TRAIN] = Split(np.arange(n, dtype=np.int64), contiguous=True)
    else:
        keep = np.ones(n, dtype=bool)
        keep[val] = False
        out[TRAIN] = Split(np.flatnonzero(keep).astype(np.int64))
        out[VALIDATION] = Split(val)
    out[TEST] = Split(np.arange(n_test, dtype=np.int64), contiguous=True)
    for name, s in out.items():
        if len(s) == 0:
            raise UserError(f"the {name} split has no samples. Received: 0 {name} samples")
    return out


def _auto_stats(a: np.ndarray, rows: Split, shape: tuple[int, ...]) -> Transform:
    """Per-channel (images) or per-feature (tables) mean and population std over the split's rows,
    accumulated in float64 a chunk at a time (Chan et al.'s pairwise update), stored float32; a
    constant channel gets std 1."""
    axis = 1  # channels of (N, C, H, W), features of (N, F)
    count = 0
    mean = np.zeros(shape[0])
    m2 = np.zeros(shape[0])
    per_row = int(np.prod(shape[1:], dtype=np.int64))
    for s, e in arrays_mod.row_chunks(a):
        if rows.contiguous:
            if s >= len(rows):
                break
            chunk = arrays_mod.take(a, slice(s, min(e, len(rows))))
        else:
            sel = rows.rows[(rows.rows >= s) & (rows.rows < e)]
            if len(sel) == 0:
                continue
            chunk = arrays_mod.take(a, sel)
        x = chunk.reshape(chunk.shape[0], *shape).astype(np.float64)
        red = tuple(i for i in range(x.ndim) if i != axis)
        n_b = x.shape[0] * per_row
        mean_b = x.mean(axis=red)
        m2_b = ((x - mean_b.reshape(1, -1, *([1] * (x.ndim - 2)))) ** 2).sum(axis=red)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * n_b / total
        m2 = m2 + m2_b + delta**2 * count * n_b / total
        count = total
    std = np.sqrt(m2 / count)
    std[std == 0] = 1.0
    return _transform(mean, std, shape)


def _transform(mean: Any, std: Any, shape: tuple[int, ...], scale: float | None = None):
    c = shape[0]
    m = np.asarray(mean, dtype=np.float32).reshape(-1)
    s = np.asarray(std, dtype=np.float32).reshape(-1)
    if len(m) == 1:
        m, s = np.repeat(m, c), np.repeat(s, c)
    bshape = (c, *([1] * (len(shape) - 1)))
    return Transform(mean=m.reshape(bshape), std=s.reshape(bshape), scale=scale)


def _transforms(
    spec: Experiment, stored: dict[str, np.ndarray], splits: dict[str, Split], recorded: Any
) -> tuple[Transform | None, ...]:
    d = spec.data
    given = {s.input: s for s in d.stats}
    unknown = sorted(set(given) - {i.name for i in spec.model.inputs})
    if unknown:
        raise UserError(
            f"data.stats names {unknown[0]!r}, not a model input "
            f"({', '.join(i.name for i in spec.model.inputs)}). Received: {unknown[0]!r}"
        )
    out: list[Transform | None] = []
    for i in spec.model.inputs:
        c = i.shape[0]
        if i.name in given:
            g = given[i.name]
            if len(g.mean) not in (1, c):
                raise UserError(
                    f"data.stats[{i.name}] needs 1 or {c} values (one per "
                    f"{'channel' if len(i.shape) == 3 else 'feature'}). Received: {len(g.mean)}"
                )
            out.append(_transform(g.mean, g.std, i.shape))
        elif d.normalize is Normalize.NONE:
            out.append(None)
        elif d.dataset is Dataset.MNIST:
            out.append(MNIST_TRANSFORM)
        elif recorded is not None and recorded.get(i.name) is not None:
            r = recorded[i.name]
            out.append(_transform(r["mean"], r["std"], i.shape))
        else:
            out.append(_auto_stats(stored[f"{i.name}_train"], splits[TRAIN], i.shape))
    return tuple(out)


def open_data(spec: Experiment, run_dir: Path | None = None) -> Data:
    """The run's data (no content checks: :func:`check` runs those once, in the driver). With a
    ``run_dir`` whose data.json the driver wrote, the statistics are read from it, not computed
    again."""
    source = locate(spec)
    stored = _stored(spec, source)
    inputs, target = _names(spec)
    splits = _splits(spec, len(stored[f"{target}_train"]), len(stored[f"{target}_test"]))
    record = read_record(run_dir) if run_dir is not None else None
    recorded = record.get("normalize") if record else None
    if spec.data.dataset is not Dataset.MNIST:  # before the statistics, which reshape rows
        where = source.partition(":")[2] if source.startswith("arrays:") else source
        _check_shapes(spec.model, stored, target, where)
    return Data(
        spec=spec.data,
        model=spec.model,
        stored=stored,
        splits=splits,
        transforms=_transforms(spec, stored, splits, recorded),
        source=source,
        sha256=record.get("sha256", "") if record else "",
    )


# ---- checks (the driver, before anything is written) -------------------------------------------


def _check_shapes(model: ModelSpec, stored: dict[str, np.ndarray], target: str, where: str) -> None:
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


def _check_targets(data: Data, width: int, where: str) -> dict[str, Any]:
    target = data.target_name
    loss = data.loss
    facts: dict[str, Any] = {}
    lo, hi = np.inf, -np.inf
    for split in ("train", "test"):
        key = f"{target}_{split}"
        a = data.stored[key]
        if loss is Loss.CROSS_ENTROPY:
            if a.dtype.kind not in "iub" or a.ndim != 1:
                raise UserError(
                    f"{where}: {key} must be integer class labels of shape (N,) for "
                    f"model.loss cross_entropy. Received: {a.dtype} {list(a.shape)}"
                )
        else:
            cols = 1 if a.ndim == 1 else int(np.prod(a.shape[1:]))
            if cols != width:
                raise UserError(
                    f"{where}: {key} has {cols} target column(s) per sample, the model outputs "
                    f"{width} (model.loss {loss.value}: one output per target column). Received: "
                    f"{key} {list(a.shape)}"
                )
        for s, e in arrays_mod.row_chunks(a):
            chunk = arrays_mod.take(a, slice(s, e))
            if len(chunk):
                lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
    if loss is Loss.CROSS_ENTROPY:
        classes = int(hi) + 1
        if lo < 0 or classes > width:
            bad = int(lo) if lo < 0 else int(hi)
            raise UserError(
                f"{where}: label {bad} is out of range for the model's {width} outputs (labels "
                f"must be 0..{width - 1}; the last layer needs units >= {classes}). Received: "
                f"labels {int(lo)}..{int(hi)}"
            )
        facts["classes"] = classes
    elif loss is Loss.BINARY_CROSS_ENTROPY and (lo < 0 or hi > 1):
        raise UserError(
            f"{where}: {target} must lie in [0, 1] for model.loss binary_cross_entropy. Received: "
            f"values {lo:g}..{hi:g}"
        )
    return facts


def check(spec: Experiment, *, digest: bool = True, width: int | None = None) -> Data:
    """Open the data and check it against the model, once, before any worker starts: shapes,
    row counts, finite values, target types and ranges against the model's output width. Returns
    the data with its content digest (``digest``) and facts (classes) filled in."""
    data = open_data(spec)
    where = data.source.partition(":")[2] if data.source.startswith("arrays:") else data.source
    width = output_width(spec.model) if width is None else width  # a model pair's: its own
    if spec.data.dataset is Dataset.MNIST:
        mnist.verify(spec.data)
        facts = _check_targets(data, width, "MNIST")
        sha = mnist.content_digest() if digest else ""
    else:
        for key, a in data.stored.items():
            arrays_mod.check_finite(a, key, where)
        facts = _check_targets(data, width, where)
        sha = arrays_mod.digest(data.stored) if digest else ""
    LOSSES[spec.model.loss].check_width(width)
    return dataclasses.replace(data, sha256=sha, facts=facts)


def write_record(data: Data, run_dir: Path) -> None:
    (Path(run_dir) / DATA_FILE).write_text(json.dumps(data.record(), indent=1) + "\n")


def read_record(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / DATA_FILE
    return json.loads(p.read_text()) if p.is_file() else None


#: MNIST's standard normalisation (normalize: auto), as a Transform
MNIST_TRANSFORM = _transform(mnist.MEAN, mnist.STD, (1, 28, 28), scale=255.0)


def normalize(images: np.ndarray) -> np.ndarray:
    """MNIST's uint8 (N, 28, 28) as the model takes it: float32 (N, 1, 28, 28), (x / 255 -
    0.1307) / 0.3081 (what :meth:`Data.inputs` gives for MNIST under normalize: auto)."""
    return MNIST_TRANSFORM.apply(images.reshape(images.shape[0], 1, *images.shape[1:]))
