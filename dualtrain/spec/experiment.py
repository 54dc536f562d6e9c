"""The Experiment: the top-level spec (its sections come from the modules beside this one), the
checks that span sections, and its plain form (``to_dict``, what ``dump_spec`` writes)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from dualtrain.errors import UserError
from dualtrain.spec.data import DataSpec
from dualtrain.spec.execution import DistributionSpec, PrecisionSpec, TFSpec
from dualtrain.spec.fields import (
    COSMETIC,
    FREE,
    SHOWS_IN_IDS,
    SHOWS_IN_INIT,
    SPEC_DATACLASS,
    check_field,
    tagged_field,
)
from dualtrain.spec.model import LayerSpec, ModelSpec
from dualtrain.spec.optimization import OptimizerSpec
from dualtrain.spec.train import DebugSpec, LoggingSpec, TrainSpec
from dualtrain.spec.vocab import METRICS, Sharding


@dataclass(**SPEC_DATACLASS)
class Experiment:
    name: str = tagged_field(COSMETIC, FREE, default="experiment")
    """Run name, used in the default output directory."""
    seed: int = tagged_field(SHOWS_IN_IDS, SHOWS_IN_INIT, default=0)
    """Seeds the data order, the validation split (``data.validation``), a table's test split
    (``data.test_fraction``), the initial weights and the dropout masks."""
    data: DataSpec = tagged_field(SHOWS_IN_IDS, default_factory=DataSpec)
    """The dataset, its normalisation, the validation split, the batch sizes and the sharding."""
    model: ModelSpec = field(default_factory=lambda: ModelSpec(preset="mlp"))
    """The model: its inputs, its loss, and dualtrain's layers or a model pair. The default is the
    mlp preset."""
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    """The optimizer, its options and its learning-rate schedule."""
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    """The precision and fp16's loss scaling. ``precision: fp16`` is short for
    ``precision: {dtype: fp16}``."""
    distribution: DistributionSpec = tagged_field(FREE, default_factory=DistributionSpec)
    """How many replicas, on which device, with which strategy, and how they meet."""
    tf: TFSpec = tagged_field(FREE, default_factory=TFSpec)
    """The TensorFlow backend's own option: its distribution strategy."""
    train: TrainSpec = field(default_factory=TrainSpec)
    """How long to train, when to evaluate, log and checkpoint. Also gradient accumulation, early
    stopping and the average of the weights."""
    determinism: bool = True
    """Deterministic kernels in both frameworks, TF32 off (see docs/parity.md)."""
    output_dir: str = tagged_field(COSMETIC, FREE, default="runs")
    """Parent folder of run directories (``--out`` names the run directory itself)."""
    logging: LoggingSpec = tagged_field(COSMETIC, FREE, default_factory=LoggingSpec)
    """Where a run reports besides metrics.jsonl. Changing it never changes the training."""
    debug: DebugSpec = tagged_field(FREE, default_factory=DebugSpec)
    """Inspection and fault injection, for tests and debugging. Leave it empty in real runs."""

    def __post_init__(self) -> None:
        check_field(
            bool(self.name) and "/" not in self.name,
            "name",
            "must be a non-empty name without '/'",
            self.name,
        )
        check_field(0 <= self.seed < 2**32, "seed", "must be in [0, 2**32)", self.seed)
        stop = self.train.early_stopping
        if stop is not None:
            metric = METRICS[self.model.loss]
            known = ["loss", metric]
            if self.data.validation is not None or self.data.validation_ids:
                known += ["val_loss", f"val_{metric}"]
            if stop.metric not in known:
                hint = (
                    " (the validation fields need data.validation)"
                    if stop.metric.startswith("val_") and len(known) == 2
                    else ""
                )
                raise UserError(
                    f"train.early_stopping.metric must be one of {known}{hint}. Received: "
                    f"{stop.metric!r}"
                )
        if self.data.sharding is Sharding.TORCH_SAMPLER:
            check_field(
                self.data.batch_size % self.distribution.world_size == 0,
                "data.batch_size",
                f"must be a multiple of world_size={self.distribution.world_size} with "
                "sharding=torch_sampler",
                self.data.batch_size,
            )
            check_field(
                self.train.accumulate == 1,
                "train.accumulate",
                "must be 1 with sharding=torch_sampler (each rank's DataLoader batches are the "
                "steps; use sharding: exact to accumulate)",
                self.train.accumulate,
            )

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def replace(self, **changes: Any) -> Experiment:
        return dataclasses.replace(self, **changes)


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, LayerSpec):  # a layer names only what it sets: {type: dense, units: 10}
        return {
            f.name: _to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.name == "type" or getattr(obj, f.name) != f.default
        }
    if isinstance(obj, ModelSpec):  # a model pair's fields, or dualtrain's layers: not both
        skip = ("preset", "layers") if obj.is_pair else ModelSpec.PAIR_FIELDS
        return {
            f.name: _to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.name not in skip
        }
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    return obj
