"""The rows of an audit record, typed: one :class:`StepRow` per optimizer step (metrics.jsonl's
``train`` rows) and one :class:`ReplicaRow` per step and replica (replicas.jsonl). The recorders
hand their rows to dualtrain.audit.record.finish, which writes them through these types (a key
neither knows is an error there, not a silent column); dualtrain.audit.read gives them back to the
audit as these types."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

#: the per-step series the audit reads (Recorded.series)
Series = Literal["lr", "loss", "loss_scale", "skipped", "grad_norm"]
#: the two digests of a sample's row (dualtrain.audit.record.row_digests): its exact bytes, and
#: its pattern (the row with its values' scale and offset taken out)
DigestKind = Literal["exact", "pattern"]


def _float(v: Any) -> float | None:
    return None if v is None else float(v)  # float() reads "nan", "inf" and "-inf" too


def _known(cls: type, d: Mapping[str, Any], skip: tuple[str, ...] = ()) -> None:
    names = {f.name for f in fields(cls)}
    extra = sorted(set(d) - names - set(skip))
    if extra:
        raise ValueError(f"{cls.__name__}: keys no field holds: {', '.join(extra)}")


@dataclass(frozen=True)
class StepRow:
    """One optimizer step, as every replica saw it."""

    step: int
    epoch: int
    """The epoch the script was in (its own numbering)."""
    loss: float
    """The mean of the replicas' losses weighted by their sample counts (nan if one is unknown)."""
    samples: int
    """Rows fed in this step, over every replica."""
    lr: float | None = None
    """The first parameter group's lr."""
    lrs: tuple[float, ...] | None = None
    """Every group's lr, where there are several."""
    loss_scale: float | None = None
    """The loss scale the step started with (None: no dynamic loss scaling)."""
    skipped: bool | None = None
    """The optimizer's update was skipped (a non-finite gradient under loss scaling)."""
    grad_norm: float | None = None
    """The global norm of the gradient the optimizer applied (nan: none was applied)."""

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> StepRow:
        """From a recorder's row or metrics.jsonl's (its ``kind`` is not kept)."""
        _known(cls, d, skip=("kind",))
        lrs = d.get("lrs")
        skipped = d.get("skipped")
        return cls(
            step=int(d["step"]),
            epoch=int(d["epoch"]),
            loss=float(d["loss"]),
            samples=int(d["samples"]),
            lr=_float(d.get("lr")),
            lrs=None if lrs is None else tuple(float(x) for x in lrs),
            loss_scale=_float(d.get("loss_scale")),
            skipped=None if skipped is None else bool(skipped),
            grad_norm=_float(d.get("grad_norm")),
        )

    def value(self, key: Series) -> float | None:
        v = getattr(self, key)
        return None if v is None else float(v)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "train", **{k: v for k, v in asdict(self).items() if v is not None}}


@dataclass(frozen=True)
class ReplicaRow:
    """One replica's share of one optimizer step."""

    step: int
    epoch: int
    replica: int
    count: int
    """Rows it fed (over every micro-batch of the step)."""
    exact: tuple[str, ...]
    """Each row's exact digest, in the order fed."""
    pattern: tuple[str, ...]
    """Each row's pattern digest (dualtrain.audit.record.row_digests)."""
    loss: float | None = None
    """Its loss (None: not known to the recorder)."""
    indices: tuple[int, ...] | None = None
    """The sampler's indices, where the loader has one (torch)."""
    batches: int | None = None
    """Micro-batches it fed in this step (torch: rec.batch calls)."""
    grad_norm: float | None = None
    """Its own gradient's norm before the all-reduce (torch)."""

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> ReplicaRow:
        _known(cls, d)
        indices = d.get("indices")
        batches = d.get("batches")
        return cls(
            step=int(d["step"]),
            epoch=int(d["epoch"]),
            replica=int(d["replica"]),
            count=int(d["count"]),
            exact=tuple(d["exact"]),
            pattern=tuple(d["pattern"]),
            loss=_float(d.get("loss")),
            indices=None if indices is None else tuple(int(i) for i in indices),
            batches=None if batches is None else int(batches),
            grad_norm=_float(d.get("grad_norm")),
        )

    def digests(self, kind: DigestKind) -> tuple[str, ...]:
        return self.exact if kind == "exact" else self.pattern

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "loss"}


def weighted_loss(rows: list[ReplicaRow]) -> tuple[float, int]:
    """(the step's loss: the replicas' losses weighted by their counts, nan where one is unknown;
    the rows fed over every replica)."""
    n = sum(r.count for r in rows)
    if not n or any(r.loss is None for r in rows):
        return math.nan, n
    return sum(float(r.loss or 0.0) * r.count for r in rows) / n, n
