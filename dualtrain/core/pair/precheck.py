"""A model pair's mistakes that need no framework, refused before any framework loads (well under a
second): model.path not a folder, a factory module that is not there, a factory name the module does
not define, model.args the factory does not take, a weight map that is not there. Each names the
absolute path it looked at.

The factory's module is read, not imported (importing it would import torch or Keras): its
top-level definitions by :mod:`ast`, and the factory's parameters from its ``def`` (a class: its
``__init__``). Whatever the source does not show plainly (a star import, a name made at run time,
a factory in a compiled or installed package) is left to the backend's own check, which imports it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

from dualtrain.errors import UserError
from dualtrain.spec import ModelSpec


def module_source(module: str, root: Path) -> Path | None:
    """The module's source file under ``root`` (a file or a package's __init__), or None."""
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _installed(module: str) -> bool:
    top = module.split(".")[0]
    try:
        return importlib.util.find_spec(top) is not None  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return False


def _definitions(tree: ast.Module) -> dict[str, ast.AST] | None:
    """Top-level names the module defines, or None when a star import makes them unknowable."""
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = node
    return names


def _params(node: ast.AST) -> tuple[set[str], bool] | None:
    """(keyword parameter names, takes **kwargs) of a def, or of a class's __init__ (None: not
    known from the source)."""
    if isinstance(node, ast.ClassDef):
        init = next(
            (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
        )
        if init is None:
            return None  # inherited: whatever the base class takes
        node = init
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    names = {x.arg for x in (*a.posonlyargs[1:], *a.args, *a.kwonlyargs)}
    if isinstance(node, ast.FunctionDef) and node.name != "__init__":
        names |= {x.arg for x in a.posonlyargs[:1]}
    return names - {"self"}, a.kwarg is not None


def _check_factory(field: str, text: str, root: Path, args: dict[str, Any]) -> None:
    module, _, attr = text.partition(":")
    path = module_source(module, root)
    if path is None:
        if not _installed(module):
            raise UserError(
                f"{field}: module {module!r} not found (no {module.replace('.', '/')}.py in "
                f"{root} and no installed package of that name; set model.path to the folder "
                f"that holds it). Received: {text!r}"
            )
        return  # an installed package: its backend imports it
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return  # the import in the backend reports it with its traceback
    defined = _definitions(tree)
    head = attr.split(".")[0]
    if defined is None:
        return
    if head not in defined:
        public = sorted(n for n, d in defined.items() if not n.startswith("_"))
        raise UserError(
            f"{field}: {path} defines no {head!r} (its top-level names: "
            f"{', '.join(public[:12]) or 'none'}). Received: {text!r}"
        )
    params = _params(defined[head]) if "." not in attr else None
    if params is not None and not params[1]:
        extra = sorted(set(args) - params[0])
        if extra:
            raise UserError(
                f"{field}: {attr} in {path} does not take model.args {extra} (it takes "
                f"{sorted(params[0]) or 'no arguments'}). Received: model.args {dict(args)}"
            )


def precheck(model: ModelSpec) -> None:
    """Refuse the pair's framework-free mistakes (module doc) in one line; no framework loads."""
    root = Path(model.path).expanduser().resolve() if model.path else Path.cwd()
    if model.path and not root.is_dir():
        raise UserError(f"model.path: no such folder: {root}. Received: {model.path!r}")
    if model.weight_map is not None:
        p = Path(model.weight_map).expanduser()
        if not p.is_file():
            raise UserError(
                f"model.weight_map: file not found: {p.resolve()}. Received: {model.weight_map!r}"
            )
    for field in ("torch", "keras"):
        text = getattr(model, field)
        if text:
            _check_factory(f"model.{field}", text, root, dict(model.args))
    if model.convert:  # called with the torch module alone: only that it is there
        _check_factory("model.convert", model.convert, root, {})
