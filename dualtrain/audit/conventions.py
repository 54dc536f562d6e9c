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

#: per optimizer, (torch option, Keras option, what it is)
OPTIONS: dict[str, list[tuple[str, str, str]]] = {
    "Adam": [
        ("eps", "epsilon", "epsilon"),
        ("betas.0", "beta_1", "beta_1"),
        ("betas.1", "beta_2", "beta_2"),
    ],
    "AdamW": [
        ("eps", "epsilon", "epsilon"),
        ("betas.0", "beta_1", "beta_1"),
        ("betas.1", "beta_2", "beta_2"),
        ("weight_decay", "weight_decay", "weight decay"),
    ],
    "Adadelta": [("rho", "rho", "rho"), ("eps", "epsilon", "epsilon")],
    "RMSprop": [
        ("alpha", "rho", "the squared average's decay"),
        ("eps", "epsilon", "epsilon"),
        ("momentum", "momentum", "momentum"),
    ],
    "SGD": [("momentum", "momentum", "momentum"), ("nesterov", "nesterov", "nesterov")],
    "Adagrad": [("eps", "epsilon", "epsilon")],
}


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
