"""The frameworks' conventions the diagnoses compare: the same optimizer's options under their
torch and Keras names, and what each default is."""

from __future__ import annotations

from typing import Any

#: torch.optim class -> Keras optimizer class
SAME_OPTIMIZER = {
    "SGD": "SGD",
    "Adam": "Adam",
    "AdamW": "AdamW",
    "Adadelta": "Adadelta",
    "Adagrad": "Adagrad",
    "RMSprop": "RMSprop",
    "Adamax": "Adamax",
    "NAdam": "Nadam",
}

#: the Adam family's shared options: (torch option, Keras option, what it is)
ADAM = [
    ("eps", "epsilon", "epsilon"),
    ("betas.0", "beta_1", "beta_1"),
    ("betas.1", "beta_2", "beta_2"),
]
AMSGRAD = ("amsgrad", "amsgrad", "amsgrad")

#: per optimizer, (torch option, Keras option, what it is)
OPTIONS: dict[str, list[tuple[str, str, str]]] = {
    "Adam": [*ADAM, AMSGRAD],
    "AdamW": [*ADAM, ("weight_decay", "weight_decay", "weight decay"), AMSGRAD],
    "NAdam": ADAM,
    "Adamax": ADAM,
    "Adadelta": [("rho", "rho", "rho"), ("eps", "epsilon", "epsilon")],
    "RMSprop": [
        ("alpha", "rho", "the squared average's decay"),
        ("eps", "epsilon", "epsilon"),
        ("momentum", "momentum", "momentum"),
    ],
    "SGD": [("momentum", "momentum", "momentum"), ("nesterov", "nesterov", "nesterov")],
    "Adagrad": [("eps", "epsilon", "epsilon")],
}


def keras_only(t: dict[str, Any], k: dict[str, Any]) -> list[str]:
    """A Keras optimizer's options that no torch optimizer has, where set (``use_ema``: the
    ema diagnosis, against a torch AveragedModel)."""
    out = []
    if (k.get("gradient_accumulation_steps") or 1) > 1:
        out.append(
            f"accumulation: Keras gradient_accumulation_steps={k['gradient_accumulation_steps']} "
            f"updates once every {k['gradient_accumulation_steps']} batches (each batch a recorded "
            f"step, the others without an update); torch's {t['type']} steps at each recorded step"
        )
    zero = [n for n, g in enumerate(t.get("groups") or []) if not g.get("weight_decay")]
    if zero and (k.get("weight_decay") or 0) > 0 and not k.get("no_decay"):
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


def torch_option(cfg: dict[str, Any], name: str) -> Any:
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


def describe_optimizer(framework: str, cfg: dict[str, Any]) -> str:
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
