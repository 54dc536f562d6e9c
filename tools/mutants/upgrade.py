"""Simulated framework upgrades (:data:`UPGRADES`, [BACKEND/]NAME): one op of one framework
changed, and the framework's version with it, as a release would; ``dualtrain compare --against``
a compare saved before must name the backend, the two versions and the operation
(parity_tests/test_against.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Upgrade:
    name: str
    backend: str
    what: str
    spec: str
    """The spec of tools.mutants.specs.SPECS it is planted on."""
    versions: str
    """The version change the verdict must name ("keras 3.15.1 and 3.16.0")."""
    words: tuple[str, ...]
    """What the verdict must say of the operation."""


#: the version the simulated release reports
KERAS_NEXT = "3.16.0"

UPGRADES = {
    u.name: u
    for u in [
        Upgrade(
            "keras_erf_float32",
            "tf",
            "keras.ops.erf computed in float32 (a float64 input cast down and back), as a "
            "release that routes erf through a float32 kernel would",
            "gelu",
            f"keras 3.15.1 and {KERAS_NEXT}",
            ("the output of layer '2' (gelu) at step 1 differs in training",),
        ),
    ]
}


def tf_keras_erf_float32() -> None:
    import keras  # lazy: framework

    erf = keras.ops.erf

    def float32_erf(x: Any) -> Any:
        return keras.ops.cast(erf(keras.ops.cast(x, "float32")), x.dtype)

    keras.ops.erf = float32_erf
    keras.__version__ = KERAS_NEXT
