"""A model pair's two side descriptions, cached on disk, so that only the first run of a pair pays
for the two framework child processes that describe it (3-5 s on a 2-core machine).

The entry is what the children wrote (each side's description, the torch module's initial
weights), under ``$DUALTRAIN_CACHE/pairs/<key>/``, written whole or not at all (a temporary folder
renamed into place). The key is the sha256 of everything the descriptions depend on:

* the spec's model section and seed, and the working directory (a relative factory resolves there);
* the source of the factories' modules and of every other ``.py`` file beside them (what they may
  import from their folder), or an installed package's version where a factory comes from one;
* dualtrain's own source (every ``.py`` file of the package: how the sides are described), and the
  versions of torch, TensorFlow, Keras and NumPy (how the initial weights are drawn).

Anything else a factory reads (a file it opens, a module outside its folder that is not an
installed package) is not in the key: ``DUALTRAIN_PAIR_CACHE=0`` turns the cache off (a folder
path puts it there instead; the test suite gives each session its own, so every session describes
each pair once). Failed descriptions are never cached: a mistake is found again on every run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dualtrain.core.data.mnist import cache_dir
from dualtrain.core.pair.precheck import module_source
from dualtrain.core.pair.record import CONVERTED_FILE
from dualtrain.spec import Experiment

OFF_ENV = "DUALTRAIN_PAIR_CACHE"
FILES = ("torch/side.json", "tf/side.json", "torch/weights.npz")
#: (a converter's port may come from KerasHub or transformers: their versions make its layout)
_PACKAGES = ("torch", "tensorflow", "keras", "numpy", "keras-hub", "transformers")


@functools.cache
def _own_source() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _user_sources(spec: Experiment) -> dict[str, str] | None:
    """sha256 of each factory module's folder's .py files (or the installed package's version);
    None when a factory's code cannot be pinned down (then nothing is cached)."""
    m = spec.model
    root = Path(m.path).expanduser().resolve() if m.path else Path.cwd()
    out: dict[str, str] = {}
    for text in (m.torch, m.keras, m.convert):
        if text is None:
            continue
        module = (text or "").partition(":")[0]
        source = module_source(module, root)
        if source is None:
            version = _version(module.split(".")[0])
            if not version:
                return None
            out[f"package:{module}"] = version
            continue
        for p in sorted(source.parent.glob("*.py")):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def key(spec: Experiment) -> str | None:
    """The cache key of the pair's descriptions, or None: not cached (turned off, or a factory
    whose code cannot be pinned down)."""
    if os.environ.get(OFF_ENV, "").strip() == "0":
        return None
    sources = _user_sources(spec)
    if sources is None:
        return None
    doc: dict[str, Any] = {
        "model": spec.to_dict()["model"],
        "seed": spec.seed,
        "cwd": os.getcwd(),
        "sources": sources,
        "dualtrain": _own_source(),
        "versions": {p: _version(p) for p in _PACKAGES},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _folder(k: str) -> Path:
    where = os.environ.get(OFF_ENV, "").strip()
    return (Path(where).expanduser() if where else cache_dir() / "pairs") / k


def files(spec: Experiment) -> tuple[str, ...]:
    """The children's files of ``spec``'s pair (a converted pair's torch side writes the learned
    map and the port too)."""
    return FILES + ((f"torch/{CONVERTED_FILE}",) if spec.model.convert else ())


def fetch(k: str | None, into: Path, spec: Experiment) -> bool:
    """Copy a cached entry's files into ``into`` (torch/, tf/ as the children write them); False
    when there is none."""
    if k is None or not all((_folder(k) / f).is_file() for f in files(spec)):
        return False
    for f in files(spec):
        (into / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_folder(k) / f, into / f)
    return True


def store(k: str | None, source: Path, spec: Experiment) -> None:
    """Keep the children's files (in ``source``) under the key; a cache that cannot be written is
    no failure of the run."""
    if k is None:
        return
    try:
        parent = _folder(k).parent
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{k}.", dir=parent))
        for f in files(spec):
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / f, tmp / f)
        try:
            tmp.rename(_folder(k))
        except OSError:  # another run stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return
