"""What every mutant patches: the engines of the two backends, and whether a run is in a mutant's
precision path."""

from __future__ import annotations

from typing import Any


def tf_engine() -> Any:
    from dualtrain.backends.tf import engine  # lazy: framework

    return engine.TFEngine


def torch_engine() -> Any:
    from dualtrain.backends.torch import engine  # lazy: framework

    return engine


def active(spec: Any, path: str) -> bool:
    """A run of ``spec`` trains in precision path ``path`` (fp32, fp16, bf16)."""
    return bool(spec.precision.dtype.value == path)
