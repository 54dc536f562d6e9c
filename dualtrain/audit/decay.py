"""Which parameters a weight decay leaves out, in both frameworks: a torch optimizer's parameter
groups with ``weight_decay=0`` (a Hugging Face Trainer's biases and LayerNorm weights) against a
Keras optimizer's ``exclude_from_weight_decay``. The torch recorder names each group's
parameters (``group_params``), the Keras recorder the variables its optimizer does not decay
(``no_decay``); the two are matched through the initial arrays' pairing (names, order, or values
for a converter's layout), so the Keras fix names the variables to exclude."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.audit.pairing import paired_weights
from dualtrain.audit.read import Recorded


@dataclass(frozen=True)
class Exclusion:
    """The Keras variables that torch's weight-decay-free groups hold (``variables``, as the Keras
    record names them), and the ``var_names`` that exclude exactly them (None where a variable
    name would also exclude a decayed one, or the record holds no variable names: a record made
    with a weight map names them as torch does)."""

    groups: list[int]
    variables: list[str]
    var_names: list[str] | None


def exclusion(trun: Recorded, krun: Recorded) -> Exclusion | None:
    """What Keras must leave out of its decay to decay as ``trun``'s groups do (None: torch's
    groups all decay, or their parameters are not recorded or do not pair)."""
    opt = trun.config.optimizer
    groups, params = opt.get("groups") or [], opt.get("group_params") or []
    zero = [n for n, g in enumerate(groups) if not g.get("weight_decay")]
    if not zero or len(params) != len(groups):
        return None
    free = {name for n in zero for name in params[n]}
    held = {name for names in params for name in names}
    pairs = paired_weights(trun, krun)
    if isinstance(pairs, str):
        return None
    keras_of = {p.a: p.b for p in pairs}  # (torch's name -> Keras's)
    if any(name not in keras_of for name in held):
        return None
    variables = sorted(keras_of[name] for name in free)
    decayed = {keras_of[name] for name in held - free}
    own = krun.config.variable_names  # (a record made with a weight map: none)
    if any(v not in own for v in [*variables, *decayed]):
        return Exclusion(zero, variables, None)
    leaves = sorted({own[v] for v in variables})
    clean = not any(own[v] in leaves for v in decayed)
    return Exclusion(zero, variables, leaves if clean else None)


def exclusion_differs(krun: Recorded, found: Exclusion | None) -> str | None:
    """``weight decay: ...`` where Keras decays (``weight_decay`` > 0) other variables than
    torch's groups do (``found``: :func:`exclusion`'s; None: the same ones, or not known)."""
    k = krun.config.optimizer
    if found is None or not (k.get("weight_decay") or 0) > 0:
        return None
    keras = sorted(k.get("no_decay") or [])
    if keras == found.variables:
        return None
    return (
        f"weight decay: torch's parameter group(s) {found.groups} hold {len(found.variables)} "
        f"parameter(s) with weight_decay=0; Keras's {k.get('type')} leaves {len(keras)} "
        f"variable(s) out of its decay (exclude_from_weight_decay), "
        f"{len(set(found.variables) - set(keras))} of them not"
    )


def exclude_call(found: Exclusion) -> str:
    """The Keras line that leaves out what torch's groups leave out."""
    if found.var_names is not None:
        return f"opt.exclude_from_weight_decay(var_names={found.var_names!r})"
    shown = ", ".join(found.variables[:4]) + (", ..." if len(found.variables) > 4 else "")
    return f"opt.exclude_from_weight_decay(var_list=[the {len(found.variables)} variables {shown}])"
