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


def torch_forward() -> Any:
    """The torch engine's forward part (its micro-batch step and losses)."""
    from dualtrain.backends.torch import forward  # lazy: framework

    return forward.ForwardPass


def torch_update() -> Any:
    """The torch engine's update part (unscale, norm, clipping, the optimizer's step)."""
    from dualtrain.backends.torch import update  # lazy: framework

    return update.GradientUpdate


def tf_forward() -> Any:
    """The tf engine's forward part (its micro-batch step and losses)."""
    from dualtrain.backends.tf import forward  # lazy: framework

    return forward.ForwardPass


def tf_update() -> Any:
    """The tf engine's update part (unscale, norm, clipping, each parameter's update)."""
    from dualtrain.backends.tf import update  # lazy: framework

    return update.GradientUpdate


def tf_step() -> Any:
    """The tf engine's step part (the replica function, batchnorm's running statistics)."""
    from dualtrain.backends.tf import step  # lazy: framework

    return step.TrainStep


def active(spec: Any, path: str) -> bool:
    """A run of ``spec`` trains in precision path ``path`` (fp32, fp16, bf16)."""
    return bool(spec.precision.dtype.value == path)
