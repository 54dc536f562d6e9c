"""The frameworks' conventions the diagnoses compare: a Keras optimizer's options no torch one has,
reading a recorded option, and when two recorded values are the same. The torch and Keras names
of each optimizer and its options are declared in dualtrain.spec.optimizers (KERAS_NAMES)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dualtrain.spec.optimizers import KERAS_NAMES


def keras_class(torch_class: str) -> str | None:
    """The Keras optimizer of a torch.optim class's rule (None: Keras has none)."""
    entry = KERAS_NAMES.get(torch_class)
    return entry.keras_class if entry else None


def keras_options(torch_class: str) -> tuple[tuple[str, str, str], ...]:
    """(torch option, Keras option, what it is) for each option both frameworks' classes take."""
    entry = KERAS_NAMES.get(torch_class)
    return entry.options if entry else ()


def keras_only(t: Mapping[str, Any], k: Mapping[str, Any], groups_known: bool = False) -> list[str]:
    """A Keras optimizer's options that no torch optimizer has, where set (``use_ema``: the
    ema diagnosis, against a torch AveragedModel). ``groups_known``: which variables torch's
    decay-free groups hold is known and judged by dualtrain.audit.decay."""
    out = []
    if (k.get("gradient_accumulation_steps") or 1) > 1:
        out.append(
            f"accumulation: Keras gradient_accumulation_steps={k['gradient_accumulation_steps']} "
            f"updates once every {k['gradient_accumulation_steps']} batches (each batch a recorded "
            f"step, the others without an update); torch's {t['type']} steps at each recorded step"
        )
    zero = [n for n, g in enumerate(t.get("groups") or []) if not g.get("weight_decay")]
    if zero and (k.get("weight_decay") or 0) > 0 and not k.get("no_decay") and not groups_known:
        out.append(
            f"weight decay: torch's parameter group(s) {zero} have weight_decay=0; Keras's "
            f"{k.get('type')} decays every variable (no exclude_from_weight_decay)"
        )
    no_decay = k.get("no_decay") or []
    if no_decay and (t.get("weight_decay") or 0) > 0 and not t.get("groups"):
        shown = ", ".join(no_decay[:4]) + (", ..." if len(no_decay) > 4 else "")
        out.append(
            f"weight decay: Keras exclude_from_weight_decay leaves out {len(no_decay)} "
            f"variable(s) ({shown}); torch's {t['type']} decays every parameter (one group)"
        )
    return out


def torch_option(cfg: Mapping[str, Any], name: str) -> Any:
    key, _, idx = name.partition(".")
    value = cfg.get(key)
    if idx and isinstance(value, list):
        return value[int(idx)]
    return value


def short(value: Any) -> str:
    """A recorded option as a person writes it: Keras's float32 lr 0.0010000000474974513 as
    0.001 (7 significant digits: a float32's), lists and strings as their repr."""
    if isinstance(value, float):
        return f"{value:.7g}"
    return repr(value)


def describe_optimizer(framework: str, cfg: Mapping[str, Any]) -> str:
    keys = {
        "torch": ("lr", "eps", "rho", "betas", "momentum", "weight_decay", "alpha"),
        "tf": ("learning_rate", "epsilon", "rho", "beta_1", "beta_2", "momentum", "weight_decay"),
    }[framework]
    shown = ", ".join(f"{k}={short(cfg[k])}" for k in keys if cfg.get(k) not in (None, False))
    return f"{cfg.get('type', '?')}({shown})"


def same_value(x: Any, y: Any) -> bool:
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return abs(float(x) - float(y)) <= 1e-6 * max(abs(float(x)), abs(float(y)), 1e-30)
    return bool(x == y) or (not x and not y)
