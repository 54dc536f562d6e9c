"""Framework limits: a framework's own op that is less accurate than float64 in its float64 path.

Not a porting mistake: a faithful port that uses the op computes the right function, but its fp64
run is float32-accurate at that op, which the fp64 reference pair (bounded at 1e-10) would read as
a semantic difference. Each limit here was measured against an exact float64 reference over the
ops a model pair can use (every ``keras.activations`` function, Keras's normalisation, softmax and
activation layers, against torch's float64 kernels and math.erf; tests/backends/tf/test_exact.py):
only these were off by more than float64 rounding, each for the same reason.

dualtrain runs each of them exactly in its fp64 runs, without touching the user's code: the
backend substitutes the op's exact float64 form for float64 inputs only (other dtypes are the
framework's own op, untouched), records where the model used it and how far the framework's op is
from the exact form (measured in that run, not taken from here), and the compare report lists them
in a section of their own (``framework_limits``), apart from the verdict's checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limit:
    op: str
    """The canonical op (what the report calls it)."""
    backend: str
    api: str
    """Where users meet it."""
    cause: str
    exact: str
    """The exact form dualtrain runs in float64 (torch's CPU kernel's formula)."""


LIMITS: dict[str, Limit] = {
    limit.op: limit
    for limit in (
        Limit(
            "gelu",
            "tf",
            "keras.activations.gelu / Activation('gelu') / keras.ops.gelu / tf.nn.gelu",
            "tf.nn.gelu casts its constant sqrt(2) (0.044715 in the tanh form) to the input's "
            "dtype from a Python float through float32, so in float64 the function is only "
            "float32-accurate",
            "x * 0.5 * (1 + erf(x * sqrt(1/2))); tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * "
            "(x + 0.044715 * x^3))), constants in float64",
        ),
        Limit(
            "leaky_relu",
            "tf",
            "keras.layers.LeakyReLU / ReLU(negative_slope=...) / keras.activations.leaky_relu / "
            "tf.nn.leaky_relu",
            "tf.nn.leaky_relu's alpha is a float32 attribute of the op, so in float64 the negative "
            "slope is the float32 nearest to the one given",
            "where(x > 0, x, x * alpha), alpha in float64",
        ),
        Limit(
            "attention_scale",
            "tf",
            "keras.layers.MultiHeadAttention / keras.ops.dot_product_attention",
            "Keras's TensorFlow dot_product_attention casts its scale 1/sqrt(key_dim), a Python "
            "float, with tf.cast, which goes through float32, so in float64 the attention "
            "scores are scaled by the float32 nearest to it",
            "the scores times 1/sqrt(key_dim) as a float64 constant",
        ),
    )
}


def describe(entry: dict[str, Any]) -> str:
    """One line for a run's recorded substitution (summary.json ``exact_ops``)."""
    op = str(entry.get("op"))
    limit = LIMITS.get(op)
    where = [str(w) for w in entry.get("where") or []]
    at = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
    err = entry.get("error")
    size = f"{err:.1g} off the exact form" if isinstance(err, float) else "off the exact form"
    cause = f" ({limit.cause})" if limit else ""
    return (
        f"framework limit: {entry.get('backend', limit.backend if limit else '?')}'s float64 "
        f"{op} is {size}{cause}; dualtrain ran the exact form in this fp64 run at "
        f"{at or 'no layer'}"
    )
