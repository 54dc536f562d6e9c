"""What a Keras model's compiled loss adds to the arithmetic, as its record says (the Keras
recorder's ``loss_terms``): layers' kernel, bias and activity regularizers, which Keras adds to
the loss it reports and differentiates, the loss's label smoothing, compile's loss_weights, the
terms layers add with add_loss, and fit's class and sample weights; and the value the other
script writes to match. A torch script's own loss is code the recorder does not see: its side is
said as the option to write (``weight_decay``, ``CrossEntropyLoss(label_smoothing=...)``)."""

from __future__ import annotations

from typing import Any

from dualtrain.audit.config import Options
from dualtrain.audit.read import Recorded


def _terms(run: Recorded) -> Options:
    return run.config.loss_terms


def regularizers(run: Recorded) -> list[dict[str, Any]]:
    return list(_terms(run).get("regularizers") or [])


def smoothing(run: Recorded) -> float:
    return float((_terms(run).get("loss") or {}).get("label_smoothing") or 0.0)


def common_l2(run: Recorded) -> float | None:
    """The one L2 factor of every weight regularizer (kernel and bias; an L1L2 without L1), or
    None (none, several values, an L1 term, an activity regularizer)."""
    regs = regularizers(run)
    l2s = {r.get("l2") for r in regs if not r.get("l1")}
    if not regs or len(l2s) != 1 or any(r["kind"] == "activity" or r.get("l1") for r in regs):
        return None
    (l2,) = l2s
    return float(l2) if l2 else None


def class_weight(run: Recorded) -> dict[str, float]:
    """fit's ``class_weight`` (class -> weight; JSON's keys are strings), or {}."""
    return {str(k): float(v) for k, v in (_terms(run).get("class_weight") or {}).items()}


def loss_weights(run: Recorded) -> list[float] | dict[str, float] | None:
    """compile's ``loss_weights``, or None where none was given or every weight is 1."""
    weights = _terms(run).get("loss_weights")
    values = list(weights.values()) if isinstance(weights, dict) else weights or []
    return weights if any(float(v) != 1.0 for v in values) else None


def added(run: Recorded) -> list[str]:
    """The layers that add a loss term with add_loss (``name (Class)``), as fit traced them."""
    return list(_terms(run).get("add_loss") or [])


def said(run: Recorded) -> str:
    """``label_smoothing=0.1, 3 L2(0.0001) regularizers (kernel, bias)`` or ''."""
    out = [f"label_smoothing={smoothing(run):g}"] if smoothing(run) else []
    if class_weight(run):
        out.append(f"fit's class_weight={class_weight(run)}")
    if _terms(run).get("sample_weight"):
        out.append("sample weights (fit's sample_weight, or a dataset's (x, y, weight))")
    if loss_weights(run):
        out.append(f"loss_weights={loss_weights(run)}")
    if added(run):
        out.append(f"add_loss terms from {', '.join(added(run))}")
    regs = regularizers(run)
    if regs:
        kinds = sorted({r["kind"] for r in regs})
        types = sorted({f"{r['type']}({r.get('l2', r.get('l1', 0)):g})" for r in regs})
        out.append(f"{len(regs)} {', '.join(types)} regularizer(s) ({', '.join(kinds)})")
    return ", ".join(out)


def to_match(run: Recorded, keras_run: Recorded) -> str | None:
    """The values ``run``'s script writes to compute the loss ``keras_run``'s compiles (None:
    nothing recorded to match)."""
    parts = []
    ls, l2 = smoothing(keras_run), common_l2(keras_run)
    weights = class_weight(keras_run)
    if run.framework == "torch":
        if ls:
            parts.append(f"CrossEntropyLoss(label_smoothing={ls:g})")
        if weights:  # Keras divides by the batch size, CrossEntropyLoss(weight=) by the weights'
            table = [weights.get(str(c), 1.0) for c in range(max(map(int, weights)) + 1)]
            parts.append(
                f"(F.cross_entropy(out, y, reduction='none') * torch.tensor({table})[y]).mean() "
                f"(fit's class_weight: each row's loss times its class's weight, divided by the "
                f"batch size; CrossEntropyLoss(weight=) divides by the weights' sum instead)"
            )
        if _terms(keras_run).get("sample_weight"):
            parts.append("each row's loss times the weight fit's sample_weight gives it")
        if loss_weights(keras_run):
            parts.append(
                f"each output's loss times its weight in loss_weights={loss_weights(keras_run)}, "
                f"summed"
            )
        if added(keras_run):
            parts.append(
                f"the term(s) {', '.join(added(keras_run))} add with add_loss, added to the loss "
                f"before backward()"
            )
        if l2:
            parts.append(
                f"weight_decay={2 * l2:g} in the optimizer (the same gradient as L2({l2:g}) on "
                f"every weight; Keras's reported loss holds the penalty, torch's does not)"
            )
        elif regularizers(keras_run):
            parts.append("the regularizers' penalty added to the loss before backward()")
    else:
        if ls:
            parts.append("label_smoothing=0 in the loss")
        if regularizers(keras_run):
            parts.append("no kernel_regularizer, bias_regularizer or activity_regularizer")
        if weights or _terms(keras_run).get("sample_weight"):
            parts.append("no class_weight or sample_weight in fit (nor weights the dataset yields)")
        if loss_weights(keras_run):
            parts.append("loss_weights=None in compile")
        if added(keras_run):
            parts.append(f"no add_loss in {', '.join(added(keras_run))}")
    return ", ".join(parts) or None
