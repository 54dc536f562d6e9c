"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dualtrain.errors import UserError

The package: ``vocab`` (the closed vocabularies), ``fields`` (checks and field policies),
``model`` (layers and presets), ``schema`` (the Experiment and its other sections), ``load``
(YAML, overrides, shipped configs). Import from here: ``from dualtrain.spec import Experiment``.
"""

from __future__ import annotations

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
from dualtrain.spec.schema import (
    DataSpec,
    DebugSpec,
    DistributionSpec,
    EarlyStoppingSpec,
    EmaSpec,
    Experiment,
    InputStats,
    LoggingSpec,
    LossScaleSpec,
    OptimizerSpec,
    PrecisionSpec,
    ScheduleSpec,
    TFSpec,
    TrainSpec,
)
from dualtrain.spec.vocab import (
    ALIASES,
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
)

__all__ = [
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
