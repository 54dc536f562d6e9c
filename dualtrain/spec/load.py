"""Loading a spec: YAML (or a dict) -> :class:`Experiment`, ``--set`` overrides, the shipped
configs, and the field-policy queries (``paths_with``, ``has_path``)."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from dualtrain.errors import UserError, shown
from dualtrain.spec.experiment import Experiment
from dualtrain.spec.model import LayerSpec
from dualtrain.spec.paths import resolve_beside
from dualtrain.spec.vocab import LayerType, StrEnum

# --------------------------------------------------------------------------------------------------
# Loading


class SpecMistakes(UserError):
    """Several mistakes in one section, said in one line; ``count``: how many (the top level
    says the total)."""

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 2 and int in non_none:  # a vocabulary or an integer (conv2d padding)
            other = next(a for a in non_none if a is not int)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            try:
                return _convert(other, value, path)
            except UserError:
                is_vocab = isinstance(other, type) and issubclass(other, StrEnum)
                names = other.values() if is_vocab else []
                raise UserError(
                    f"{path} must be one of {names} or an integer. Received: {shown(value)}"
                ) from None
        return _convert(non_none[0], value, path)
    if value is None:
        raise UserError(f"{path} must not be null. Received: None")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{path} must be a mapping. Received: {shown(value)}")
        return _build(typing.cast(type, tp), value, path)  # tp: a type hint, so a class
    if origin is dict:  # model.args: keyword arguments for the user's factories, as written
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise UserError(
                f"{path} must be a mapping of names to values. Received: {shown(value)}"
            )
        return dict(value)
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return tp.parse(value, path)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{path} must be a list. Received: {shown(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise UserError(f"{path} must have {len(args)} items. Received: {list(value)!r}")
        return tuple(
            _convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{path} must be true or false. Received: {shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{path} must be an integer. Received: {shown(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{path} must be a number. Received: {shown(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{path} must be a string. Received: {shown(value)}")
    raise TypeError(f"unsupported spec type {tp!r} at {path}")  # programming error


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, data: dict[str, Any], path: str = "") -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    errors: list[str] = []  # every mistake of the file at once, not one per attempt
    count = 0
    for key in data:
        if key not in names:
            where = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            errors.append(
                f"unknown key '{where}' (valid keys{' in ' + path if path else ''}: "
                f"{', '.join(names)}){hint or '.'} Received: {key}={shown(data[key])}"
            )
    hints = _hints(cls)
    kwargs = {}
    for name in names:
        if name in data:
            sub = f"{path}.{name}" if path else name
            try:
                kwargs[name] = _convert(hints[name], data[name], sub)
            except UserError as exc:
                errors.append(str(exc))
                count += exc.count - 1 if isinstance(exc, SpecMistakes) else 0
    if errors:
        count += len(errors)
        if path or count == 1:
            raise SpecMistakes("; ".join(errors), count)
        raise UserError(f"{count} mistakes in the spec: " + "; ".join(errors))
    if cls is LayerSpec and "type" not in kwargs:
        raise UserError(
            f"{path} needs a 'type' ({', '.join(LayerType.values())}). Received: {shown(data)}"
        )
    try:
        return cls(**kwargs)
    except UserError as exc:
        if cls is LayerSpec:  # the layer cannot know its own position in the list
            raise UserError(f"{path}: {exc}") from None
        raise
    except TypeError as exc:  # a missing required field
        raise UserError(f"{path or 'spec'}: {exc}. Received: {shown(data)}") from None


def _normalise(raw: dict[str, Any]) -> dict[str, Any]:
    """Accept the short forms users write: ``precision: fp16``."""
    raw = dict(raw)
    if isinstance(raw.get("precision"), str):
        raw["precision"] = {"dtype": raw["precision"]}
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("validation"), list):
        raw["data"] = {k: v for k, v in data.items() if k != "validation"}
        raw["data"]["validation_ids"] = data["validation"]
    model = raw.get("model")
    if (
        isinstance(model, dict)
        and "preset" not in model
        and not model.get("layers")
        and not model.get("torch")
        and not model.get("keras")
    ):
        raw["model"] = {**model, "preset": "mlp"}  # the default model, as when 'model' is absent
    return raw


def from_dict(raw: Any) -> Experiment:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(
            f"the spec must be a YAML mapping at the top level. Received: {type(raw).__name__}"
        )
    return _build(Experiment, _normalise(raw))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``optimizer.lr=0.1`` -> (["optimizer", "lr"], 0.1); the value is parsed as YAML."""
    if "=" not in text:
        raise UserError(f"--set takes key.path=value. Received: {text!r}")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set key must be a dotted path like optimizer.lr. Received: {key!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = _normalise(raw or {})
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
            elif not isinstance(nxt, dict):
                raise UserError(
                    f"--set {'.'.join(parts[: i + 1])} is not a section. Received: {text!r}"
                )
            else:
                nxt = dict(nxt)
            node[part] = nxt
            node = nxt
        node[parts[-1]] = value
    return raw


#: The configs shipped with the package (the repository's configs/, linked into the package).
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def shipped_config(path: str | Path) -> Path | None:
    """A shipped config a user names as in the README from anywhere: ``mnist_mlp``,
    ``mnist_mlp.yaml`` or ``configs/mnist_mlp.yaml``; None if ``path`` names none."""
    p = Path(path)
    if p.is_absolute() or p.parent not in (Path("."), Path("configs")):
        return None
    name = p.name if p.suffix in (".yaml", ".yml") else p.name + ".yaml"
    found = SHIPPED_CONFIGS / name
    return found if found.is_file() else None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    named = shipped_config(p) if not p.exists() else None
    if named is not None:
        p = named
    if p.is_dir():
        found = sorted(q.name for q in p.glob("*.y*ml"))
        hint = f"; it holds {', '.join(found)}" if found else ""
        raise UserError(f"--config must be a YAML file, not a folder{hint}. Received: {str(p)!r}")
    if not p.is_file():
        shipped = ", ".join(sorted(q.stem for q in SHIPPED_CONFIGS.glob("*.yaml")))
        raise UserError(
            f"config file not found: {str(p)!r} (shipped configs, usable by name from "
            f"anywhere: {shipped})"
        )
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{p}: invalid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: not a text file") from None
    if raw is None:  # an empty file: a user who meant all defaults passes no --config
        raise UserError(
            f"{p}: the file is empty (no spec in it); to train on the defaults, leave "
            f"out --config. Received: {str(p)!r}"
        )
    if not isinstance(raw, dict):
        raise UserError(
            f"{p}: the spec must be a YAML mapping at the top level. Received: {type(raw).__name__}"
        )
    return resolve_beside(raw, p)  # relative paths beside the file (spec/paths.py)


def load_spec(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read a YAML spec, apply ``key.path=value`` overrides, validate, return the frozen
    Experiment."""
    raw = read_yaml(path) if path is not None else {}
    return from_dict(apply_overrides(raw, list(overrides)))


def dump_spec(spec: Experiment) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)


def paths_with(policy: str, cls: type = Experiment, prefix: str = "") -> tuple[str, ...]:
    """The dotted spec paths declared with ``policy`` (:data:`COSMETIC`, :data:`FREE`); a tagged
    section is one path (everything under it)."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if policy in f.metadata.get("policy", ()):
            out.append(path)
        elif dataclasses.is_dataclass(hints[f.name]):
            out.extend(paths_with(policy, hints[f.name], path + "."))
    return tuple(out)


def has_path(path: str) -> bool:
    """Whether ``path`` (dotted, e.g. ``optimizer.schedule.name``) names a field or section of the
    Experiment schema."""
    cls: Any = Experiment
    for part in path.split("."):
        if not (
            dataclasses.is_dataclass(cls) and part in {f.name for f in dataclasses.fields(cls)}
        ):
            return False
        cls = typing.get_type_hints(cls)[part]
    return True
