"""Relative paths in a spec file, resolved beside the file.

A path a spec file gives relative (``data.path``, ``data.test_path``, ``data.data_dir``,
``model.path``, ``model.weight_map``) is looked up beside the spec file first; ``model.weight_map``
beside ``model.path`` (the pair's own files) before that. Where it is found, the spec holds its
absolute path from then on (the run's spec.yaml records it, so resume and continuation find the same
file from any working directory). Where it is not found beside the file, the path stays as written:
relative to the working directory, as before, and the not-found error names the absolute path
tried. Paths given with ``--set`` are the command line's: relative to the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: (section, field) of every path a spec can give
PATH_FIELDS = (
    ("data", "path"),
    ("data", "test_path"),
    ("data", "data_dir"),
    ("model", "path"),
    ("model", "weight_map"),
)


def _found(value: str, *folders: Path) -> str | None:
    for folder in folders:
        candidate = folder / value
        if candidate.exists():
            return str(candidate.resolve())
    return None


def resolve_beside(raw: dict[str, Any], spec_file: Path) -> dict[str, Any]:
    """``raw`` (a spec file's mapping) with its relative paths found beside ``spec_file`` made
    absolute (module doc); everything else as it is."""
    here = spec_file.resolve().parent
    for section, field in PATH_FIELDS:
        part = raw.get(section)
        if not isinstance(part, dict):
            continue
        value = part.get(field)
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            continue
        if value.startswith("~"):
            continue
        folders = [here]
        model_path = (raw.get("model") or {}).get("path") if section == "model" else None
        if field == "weight_map" and isinstance(model_path, str) and model_path:
            folders.insert(0, here / Path(model_path).expanduser())
        found = _found(value, *folders)
        if found is not None:
            part[field] = found
    return raw
