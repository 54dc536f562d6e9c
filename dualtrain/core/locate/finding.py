"""The locator's finding: the first weighted layer where a model pair's sides part (its input, its
own output, its training-mode output, its running statistics), else the model's output, else a
parameter gradient, else a parameter that should not move at all; each named with the classic
mistake the evidence fits (:mod:`.mistakes`), from the rows :mod:`.compare` makes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dualtrain.core.locate.attention import (
    attention_mistake,
    norm_order_mistake,
    pool_mistake,
    residual_mistake,
)
from dualtrain.core.locate.compare import (
    TOL,
    Row,
    compare_layer,
    gradient,
    no_gradient,
    rel,
    weighted_layers,
)
from dualtrain.core.locate.mistakes import (
    FLOAT32_INSIDE,
    activation_mistake,
    batchnorm_mistake,
    flatten_mistake,
    float32_inside,
    layer_mistake,
    softmax,
)
from dualtrain.core.pair.record import Layout


@dataclass
class Finding:
    where: str
    """The torch module (and Keras layer) where the difference is introduced, or "output"."""
    what: str
    """input, output, model output, gradient, or nothing."""
    size: float
    mistake: str
    """The classic mistake the evidence fits ("" when none does)."""
    detail: str
    rows: list[Row] = field(default_factory=list)

    @property
    def at_limit(self) -> bool:
        """The two sides part only by float32 arithmetic inside a layer (a library's limit in
        float64, :data:`FLOAT32_INSIDE`), with no mistake after it."""
        return self.mistake.startswith(FLOAT32_INSIDE)

    @property
    def agrees(self) -> bool:
        """The two sides agree to float64 rounding at every layer (``what`` is "nothing")."""
        return self.what == "nothing"

    def lead(self) -> str:
        """The finding in a few words, for the verdict line: the layer and the mistake (or what
        differs there, and by how much)."""
        if self.what == "nothing":
            return "the models agree layer by layer on the locator's batch" + (
                f" ({self.mistake})" if self.mistake else ""
            )
        if self.mistake:
            at = f"the input of {self.where}" if self.what == "input" else self.where
            return f"{at}: {self.mistake}"
        return f"{self.where}: its {self.what} differs ({self.amount()}; no classic mistake fits)"

    def amount(self) -> str:
        """How much the sides differ: a relative size, or that the two outputs have other shapes
        (a torch module paired with a larger Keras layer: Hugging Face's packed q, k, v projection
        with KerasHub's whole attention)."""
        return "other shapes" if math.isinf(self.size) else f"{self.size:.2g}"

    def line(self) -> str:
        if self.what == "nothing":
            return f"locator: {self.detail}" + (f" Note: {self.mistake}." if self.mistake else "")
        name = f": {self.mistake}" if self.mistake else ""
        return (
            f"locator: first difference at {self.where} ({self.what}, {self.amount()}){name}. "
            f"{self.detail}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def locate(
    layout: Layout,
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
) -> Finding:
    rows: list[Row] = []
    prev_out_ok = True
    prev = "the model's input"
    # parameters whose gradient is rounding noise on both sides: their relative difference says
    # nothing, and they are judged on their own below
    still = no_gradient(layout, t, k)
    # a layer that computes part of its work in float32 (a library's limit) does not stop the
    # search: a mistake after it is still named, with the limit said beside it
    limit: Finding | None = None
    for module, layer, kind in weighted_layers(layout):
        row = compare_layer(layout, module, layer, t, k, still)
        rows.append(row)
        found = _layer_finding(
            layout,
            module,
            layer,
            kind,
            row,
            rows,
            t,
            k,
            weights,
            prev=prev,
            prev_out_ok=prev_out_ok,
            inherited=0.0 if limit is None else INHERITED,
        )
        if found is not None and not found.at_limit:
            return found if limit is None else _beside(found, limit)
        limit = limit or found
        prev_out_ok = row.own is None or row.own <= TOL
        prev = f"{module!r}"
    if limit is not None:
        return limit
    found = _output_finding(prev, rows, t, k)
    if found is not None:
        return found
    found = _gradient_finding(rows)
    if found is not None:
        return found
    # an attention's key bias is torch's own (nn.MultiheadAttention has one whenever it has
    # biases): not a porting mistake, said beside the agreement
    keys = [n for n in still if n.endswith("[key]")]
    if len(keys) < len(still):
        return _still_parameter_finding(layout, [n for n in still if n not in keys], rows, t, k)
    return Finding(
        "",
        "nothing",
        0.0,
        (
            f"{', '.join(keys)}: the key projection's bias has no gradient in exact arithmetic "
            f"(it moves every score of a query alike, and the softmax not at all), so each side "
            f"computes its own rounding noise there; dualtrain's training sets that gradient to "
            f"zero on both sides (the exact step), so adam cannot scale the noise into updates"
        )
        if keys
        else "",
        f"the two models agree on this batch to {TOL:g} (every layer's input, output and "
        f"gradient, and the model's output): the difference is not in the models' forward or "
        f"backward on these samples.",
        rows,
    )


#: the input difference a layer may inherit from a float32 limit before it: a few float32
#: roundings grown by the layers between (on Hugging Face's Llama against KerasHub's, two blocks
#: of RMSNorms in float32, every layer's gradient, which inherits them all, differs by 1.5e-7 at
#: most), beneath what a parameter-free mistake makes (gelu's tanh form ~1e-3, a dropped residual
#: or another pooling ~1)
INHERITED = 1e-5


def _beside(found: Finding, limit: Finding) -> Finding:
    """``found`` with the float32 limit before it said in its detail."""
    said = f" Before it, {limit.where} differs by {FLOAT32_INSIDE} ({limit.amount()}): a limit."
    return dataclasses.replace(found, detail=found.detail + said)


def _layer_finding(
    layout: Layout,
    module: str,
    layer: str,
    kind: str,
    row: Row,
    rows: list[Row],
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    *,
    prev: str,
    prev_out_ok: bool,
    inherited: float = 0.0,
) -> Finding | None:
    """A difference this layer introduces (its input, given that the layer before it agreed; its
    output; its training-mode output; its running statistics), or None."""
    where = f"torch {module!r} / Keras {layer!r}"
    if row.input is not None and row.input > max(TOL, inherited) and prev_out_ok:
        mistake = (
            _attention(layout, module, t, k, weights, inside=True)
            or norm_order_mistake(layout, module, t, k, weights)
            or pool_mistake(t, module, k.get(f"kin/{module}"))
            or residual_mistake(t, module, k.get(f"kin/{module}"))
            or flatten_mistake(layout, module, t, k)
            or activation_mistake(t, k)
        )
        return Finding(
            where,
            "input",
            row.input,
            mistake,
            f"The layers before it agree (their outputs match), so the parameter-free "
            f"operations between {prev} and this layer differ (activations, flatten, add, "
            f"padding, pooling).",
            rows,
        )
    if row.own is not None and row.own > TOL:
        mistake = (
            _attention(layout, module, t, k, weights)
            or layer_mistake(layout, module, layer, kind, t, k, weights)
            or float32_inside(row.own)
        )
        return Finding(
            where,
            "output",
            row.own,
            mistake,
            "Fed the torch module's input, the Keras layer computes another output: the "
            "difference is introduced here, not inherited.",
            rows,
        )
    if row.train is not None and row.train > TOL:
        mistake = layer_mistake(layout, module, layer, kind, t, k, weights)
        return Finding(
            where,
            "training-mode output",
            row.train,
            mistake,
            "In inference the layer agrees; in training mode (batch statistics), fed the "
            "torch module's input, it computes another output.",
            rows,
        )
    if row.running is not None and row.running > TOL:
        mistake = batchnorm_mistake(layout, module, layer, t, k, weights)
        return Finding(
            where,
            "running statistics",
            row.running,
            mistake,
            "Its outputs agree; the running statistics one training step leaves differ, "
            "which the next evaluation (and every later step's inference) inherits.",
            rows,
        )
    return None


def _attention(
    layout: Layout,
    module: str,
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    *,
    inside: bool = False,
) -> str:
    """An attention mistake (:mod:`.attention`): ``inside``, in what reaches an attention's
    output projection (the heads' context a hand-written port computes); else in what a Keras
    MultiHeadAttention fed torch's input makes."""
    mha = module.removesuffix(".out_proj") if inside else module
    heads = next((a.heads for a in layout.torch.torch if a.module == mha and a.heads), None)
    if (inside and mha == module) or heads is None:
        return ""
    proj, mask = t.get(f"proj/{mha}"), t.get(f"mask/{mha}")
    if inside:
        return attention_mistake(k.get(f"kin/{module}"), proj, heads, mask)
    fed, out = k.get(f"fed/{module}"), t.get(f"out/{module}")
    if fed is None or out is None or fed.shape != out.shape:
        return ""
    w, b = weights.get(f"{mha}.out_proj.weight"), weights.get(f"{mha}.out_proj.bias")
    return attention_mistake(fed, proj, heads, mask, w, b)


def _output_finding(
    prev: str, rows: list[Row], t: dict[str, np.ndarray], k: dict[str, np.ndarray]
) -> Finding | None:
    """A difference in the model's output after every weighted layer agreed, or None."""
    out = max(
        (r for r in (rel(k.get(key), t.get(key)) for key in ("output/eval", "output")) if r),
        default=None,
    )
    if out is not None and out > TOL:
        mistake = ""
        softmaxed = rel(k["output"], softmax(t["output"]))
        if softmaxed is not None and softmaxed < TOL:
            mistake = "softmax inside the model while the loss takes logits"
        else:
            mistake = activation_mistake(t, k)
        return Finding(
            f"the model's output, after {prev}",
            "model output",
            out,
            mistake,
            "Every weighted layer agrees; what follows the last one differs.",
            rows,
        )
    return None


def _gradient_finding(rows: list[Row]) -> Finding | None:
    """The first layer whose parameter gradient differs while the forward passes agree, or None."""
    for row in rows:
        if row.grad is not None and row.grad > TOL:
            return Finding(
                f"torch {row.module!r} / Keras {row.keras!r}",
                "gradient",
                row.grad,
                "",
                "The forward passes agree; this layer's parameter gradient of the same loss "
                "differs (a custom gradient, or an operation whose derivative differs).",
                rows,
            )
    return None


def _still_parameter_finding(
    layout: Layout,
    still: list[str],
    rows: list[Row],
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
) -> Finding:
    """A parameter with no gradient in exact arithmetic (``still``), which each side moves by its
    own rounding noise."""
    base = still[0].partition("[")[0]
    module = next(a.module for a in layout.torch.torch if a.name == base)
    row = next(r for r in rows if r.module == module)
    return Finding(
        f"torch {module!r} / Keras {row.keras!r}",
        "gradient",
        rel(gradient(k, still[0]), gradient(t, still[0])) or 0.0,
        f"a parameter with no gradient in exact arithmetic ({', '.join(still[:3])}: its "
        f"gradient is rounding noise on both sides, as for a bias right before a "
        f"batchnorm, which subtracts it again); each side moves it by its own noise, and "
        f"an optimizer that normalises the gradient (adam, rmsprop) scales that noise up to "
        f"~lr * 1e-9 per step: drop the parameter (bias=False / use_bias=False, as "
        f"torchvision's ResNets do)",
        "Every layer's input and output, and every other gradient, agree; the pair's "
        "weights part through a parameter that should not move at all.",
        rows,
    )
