"""The user's factories of a model pair (``model.torch``, ``model.keras``: ``"package.module:
factory"``): imported from ``model.path``, called with ``model.args``, their source digested, the
output they build checked. Each backend calls these in its own processes.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dualtrain.errors import UserError


def import_factory(text: str, folder: str | None, field_name: str) -> Any:
    """The callable ``"package.module:factory"`` names (``model.torch`` or ``model.keras``),
    imported with ``folder`` (model.path; default: the working directory) first on sys.path. Each
    backend calls it in its own processes; a module or name that is not there is one line."""
    root = import_path(folder)
    mod_name, _, attr = text.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and mod_name.startswith(exc.name):  # the factory's module itself is missing
            raise UserError(
                f"{field_name}: module {mod_name!r} not found (searched {root} and the installed "
                f"packages; set model.path to the folder that holds it). Received: {text!r}"
            ) from None
        raise  # the user's module imports something missing: its own traceback says what
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise UserError(
                f"{field_name}: {mod_name} ({getattr(module, '__file__', '?')}) has no {attr!r}. "
                f"Received: {text!r} (the module defines: {', '.join(names[:12])})"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{field_name}: {text!r} is not callable. Received: {type(obj).__name__}")
    return obj


def import_path(folder: str | None) -> str:
    """``folder`` (model.path; default: the working directory) first on sys.path, where the
    user's modules are imported from; that folder."""
    root = str(Path(folder).expanduser().resolve()) if folder else str(Path.cwd())
    if folder and not Path(root).is_dir():
        raise UserError(f"model.path: no such folder. Received: {folder!r}")
    if root not in sys.path:
        sys.path.insert(0, root)
    return root


def source_digest(factory: Any) -> str:
    """sha256 of the file that defines ``factory`` (a model's code, recorded with the run)."""
    try:
        path = inspect.getsourcefile(factory)
    except TypeError:
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""


def call_factory(factory: Any, args: dict[str, Any], field_name: str) -> Any:
    """``factory(**args)``; arguments it does not take are one line (the factory's own errors
    keep their traceback: they are the user's code)."""
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        raise UserError(
            f"{field_name}: the factory does not take model.args {sorted(args)} ({exc}). "
            f"Received: {args!r}"
        ) from None
    except ValueError:  # no signature to check (a builtin)
        pass
    return factory(**args)


def sample_shapes(inputs: Iterable[Any]) -> list[tuple[int, ...]]:
    return [tuple(i.shape) for i in inputs]


def check_output(shape: tuple[int, ...], side: str, cls: str) -> tuple[int, ...]:
    """One sample's output must be a flat vector (logits or values)."""
    if len(shape) != 1:
        raise UserError(
            f"model.{side}: {cls} must return (N, outputs) for a batch of N; it returned "
            f"{list(shape)} per sample. Received: output shape (N, {', '.join(map(str, shape))})"
        )
    return shape
