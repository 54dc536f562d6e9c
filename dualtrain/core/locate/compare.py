"""What a model pair's two sides recorded on the same batch, compared: for each weighted layer, in
torch forward order, the relative differences of its input, its own output, its parameters'
gradients, its training-mode output and its running statistics (a :class:`Row`); and the
parameters whose gradient is rounding noise on both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dualtrain.core.pair.record import Layout

#: A float64 difference larger than this is a difference in what is computed (float64 rounding
#: through these layers is ~1e-15 relative)
TOL = 1e-9


def rel(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return math.inf
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (den if den > 0 else 1.0)


@dataclass
class Row:
    module: str
    keras: str
    input: float | None
    own: float | None
    grad: float | None
    train: float | None = None
    """Training mode: the Keras layer's output fed the torch module's training-mode input."""
    running: float | None = None
    """Batchnorm: the running statistics one training call leaves, fed the same input."""


def weighted_layers(layout: Layout) -> list[tuple[str, str, str]]:
    """(torch module, Keras layer, kind) of every weighted layer, in torch forward order."""
    entries = layout.by_torch()
    keras = {v.path: v for v in layout.keras.keras}
    out: list[tuple[str, str, str]] = []
    for a in layout.torch.torch:
        if out and out[-1][0] == a.module:
            continue
        v = keras[entries[a.name].targets[0]]
        # a MultiHeadAttention's projections: the attention layer is the unit
        out.append(
            (a.module, v.layer.rsplit("/", 1)[0] if v.kind == "attention" else v.layer, a.kind)
        )
    return out


def compare_layer(
    layout: Layout,
    module: str,
    layer: str,
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
    still: list[str],
) -> Row:
    """The row of one weighted layer (``still``: the parameters whose gradient is judged apart)."""
    fed, made = k.get(f"fed/{module}"), t.get(f"out/{module}")
    proj = t.get(f"proj/{module}")  # an attention's packed projection, against a port's Dense
    if proj is not None and fed is not None and fed.shape == proj.shape:
        made = proj
    row = Row(
        module,
        layer,
        rel(k.get(f"kin/{module}"), t.get(f"in/{module}")),
        rel(fed, made),
        _worst(layout, module, True, "grad/", "grad/", t, k, skip=still),
        rel(k.get(f"tfed/{module}"), t.get(f"tout/{module}")),
        _worst(layout, module, False, "fedrun/", "running/", t, k),
    )
    return row


def _worst(
    layout: Layout,
    module: str,
    trainable: bool,
    k_tag: str,
    t_tag: str,
    t: dict,
    k: dict,
    skip: list[str] | None = None,
) -> float | None:
    """The largest relative difference over the module's trainable (or non-trainable) arrays,
    less ``skip``."""
    values = [
        rel(k.get(f"{k_tag}{a.name}"), t.get(f"{t_tag}{a.name}"))
        for a in layout.torch.torch
        if a.module == module and a.trainable == trainable and a.name not in (skip or ())
    ]
    present = [v for v in values if v is not None]
    return max(present) if present else None


#: the parts of an array split across several Keras variables (torch's packed in_proj)
PARTS = ("query", "key", "value")


def gradient(side: dict, name: str) -> np.ndarray | None:
    """A recorded gradient by name, or one part of it (``in_proj_bias[key]``: its key third)."""
    base, _, part = name.partition("[")
    g = side.get(f"grad/{base}")
    if g is None or not part:
        return g
    return np.split(g, len(PARTS))[PARTS.index(part.rstrip("]"))]


def _norm(a: np.ndarray | None) -> float:
    return 0.0 if a is None else float(np.linalg.norm(a))


def no_gradient(layout: Layout, t: dict, k: dict) -> list[str]:
    """Trainable arrays, or parts of a packed one (the key projection's bias has no gradient in
    exact arithmetic: a softmax does not change when every score of a query moves alike), whose
    gradient is rounding noise (under 1e-12 of the largest) on both sides."""
    split = {a.name for a in layout.torch.torch if a.name.endswith("in_proj_bias")}
    names = []
    for a in layout.torch.torch:
        if a.trainable and f"grad/{a.name}" in t and f"grad/{a.name}" in k:
            names += [a.name] + ([f"{a.name}[{p}]" for p in PARTS] if a.name in split else [])
    norms = {n: (_norm(gradient(t, n)), _norm(gradient(k, n))) for n in names}
    top = max((max(v) for v in norms.values()), default=0.0)
    return [n for n, (a, b) in norms.items() if top > 0 and max(a, b) < 1e-12 * top]
