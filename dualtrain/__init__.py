"""dualtrain: one experiment spec, two distributed training runs (PyTorch and TensorFlow/Keras 3).

Python API (docs/python-api.md)::

    import dualtrain

    res = dualtrain.run("configs/mnist_mlp.yaml", "torch", train={"epochs": 1}, world_size=2)
    print(res.test_accuracy, res.run_dir)
    cmp = dualtrain.compare("configs/mnist_mlp.yaml", train={"epochs": 1})
    assert cmp.passed, cmp.diagnosis.summary()

The top-level package is framework-free: it never imports torch, tensorflow or keras, and
``import dualtrain`` loads nothing else either; ``run``, ``compare``, ``resume``, ``experiment`` and
the result types load on first use (from :mod:`dualtrain.api`). Backends live in
``dualtrain.backends.torch`` and ``dualtrain.backends.tf`` and run in their own processes.

The package is laid out as the pipeline a run goes through, each folder importing only from the
ones before it (tests/package/test_boundaries.py): ``spec`` -> ``records`` -> ``core`` ->
``runtime`` -> ``launch`` -> ``backends`` -> ``parity`` -> ``driver`` -> ``api`` -> ``cli``
(docs/architecture.md).
"""

from __future__ import annotations

import importlib

from dualtrain.errors import RunFailed, UserError
from dualtrain.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import dualtrain stays cheap
if TYPE_CHECKING:  # what type checkers see; at run time these load lazily (__getattr__)
    from dualtrain.api import CompareResult, RunResult, compare, experiment, resume, run
    from dualtrain.spec import Experiment

__all__ = [
    "CompareResult",
    "Experiment",
    "RunFailed",
    "RunResult",
    "UserError",
    "__version__",
    "compare",
    "experiment",
    "resume",
    "run",
]

_API = ("CompareResult", "RunResult", "compare", "experiment", "resume", "run")


def __getattr__(name: str) -> object:
    if name in _API:
        return getattr(importlib.import_module("dualtrain.api"), name)
    if name == "Experiment":
        return importlib.import_module("dualtrain.spec").Experiment
    raise AttributeError(f"module 'dualtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
