"""The experiment spec: what one run means, framework-free.

The package: ``vocab`` (the closed vocabularies), ``fields`` (checks and field policies),
``model`` (layers and presets), ``optimizers`` (each optimizer declared once), the sections
``data`` (dataset, normalisation, validation, batching, sharding), ``optimization`` (the
optimizer's options and its lr schedule), ``execution`` (precision and loss scaling,
distribution, TF strategy), ``train`` (train with early stopping and EMA; logging, debug),
``experiment`` (the Experiment over them all), ``load`` (YAML, overrides, shipped configs).
Import from here: ``from dualtrain.spec import Experiment``.
"""

from __future__ import annotations

from dualtrain.spec.data import DataSpec, InputStats
from dualtrain.spec.execution import (
    DistributionSpec,
    LossScaleSpec,
    PrecisionSpec,
    TFSpec,
)
from dualtrain.spec.experiment import Experiment
from dualtrain.spec.fields import (
    COSMETIC,
    FREE,
    SHOWS_IN_IDS,
    SHOWS_IN_INIT,
    SHOWS_IN_LR,
    SHOWS_IN_SCALE,
)
from dualtrain.spec.load import (
    SHIPPED_CONFIGS,
    apply_overrides,
    dump_spec,
    from_dict,
    has_path,
    load_spec,
    parse_override,
    paths_with,
    read_yaml,
    shipped_config,
)
from dualtrain.spec.model import (
    PRESETS,
    InputSpec,
    LayerSpec,
    ModelSpec,
)
from dualtrain.spec.optimization import OptimizerSpec, ScheduleSpec
from dualtrain.spec.optimizers import OPTIMIZERS, SLOT_ORDER
from dualtrain.spec.train import (
    DebugSpec,
    EarlyStoppingSpec,
    EmaSpec,
    LoggingSpec,
    TrainSpec,
)
from dualtrain.spec.vocab import (
    ALIASES,
    METRICS,
    Approximate,
    Backend,
    Dataset,
    Device,
    Every,
    LastBatch,
    LayerType,
    Loss,
    Normalize,
    OptimizerName,
    Padding,
    Precision,
    Progress,
    ScheduleInterval,
    ScheduleName,
    Sharding,
    StopMode,
    Strategy,
    StrEnum,
    TFStrategy,
    TokenPool,
)

__all__ = [
    "METRICS",
    "OPTIMIZERS",
    "SLOT_ORDER",
    "ALIASES",
    "Backend",
    "COSMETIC",
    "DataSpec",
    "Dataset",
    "InputSpec",
    "InputStats",
    "Loss",
    "Normalize",
    "DebugSpec",
    "Device",
    "DistributionSpec",
    "Every",
    "Experiment",
    "FREE",
    "LastBatch",
    "LayerSpec",
    "LayerType",
    "LoggingSpec",
    "LossScaleSpec",
    "ModelSpec",
    "OptimizerName",
    "OptimizerSpec",
    "PRESETS",
    "SHOWS_IN_IDS",
    "SHOWS_IN_INIT",
    "SHOWS_IN_LR",
    "SHOWS_IN_SCALE",
    "Approximate",
    "Padding",
    "Precision",
    "PrecisionSpec",
    "Progress",
    "SHIPPED_CONFIGS",
    "ScheduleInterval",
    "ScheduleName",
    "ScheduleSpec",
    "Sharding",
    "StrEnum",
    "TFSpec",
    "TokenPool",
    "Strategy",
    "TFStrategy",
    "TrainSpec",
    "EarlyStoppingSpec",
    "EmaSpec",
    "StopMode",
    "apply_overrides",
    "dump_spec",
    "from_dict",
    "has_path",
    "load_spec",
    "parse_override",
    "paths_with",
    "read_yaml",
    "shipped_config",
]
