"""``dualtrain env``: the facts that decide whether two runs compute the same numbers (docs/env.md).

The CLI process imports no framework: each installed backend reports its facts from its own
subprocess (``python -m dualtrain.backends.<name>.tools env``), with a timeout. A backend that is
not installed is reported as missing, one that fails as "broken: <one line>"; neither is an error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import click

from dualtrain.core import kernels
from dualtrain.errors import UserError
from dualtrain.launch.child import worker_env

BACKENDS = ("torch", "tf")
CHOICES = (*BACKENDS, "all", "none")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[:300]


def probe_backend(backend: str, timeout_s: float) -> dict[str, Any]:
    """Run ``tools env`` of one backend. Returns {"status": "ok", "facts": {...}} or
    {"status": "missing" | "broken", "detail": one line}."""
    from dualtrain.records.envinfo import missing_packages  # lazy: heavy (+25 ms on --help)

    missing = missing_packages(backend)
    if missing:
        return {"status": "missing", "detail": f"{', '.join(missing)} not installed"}
    cmd = [sys.executable, "-m", f"dualtrain.backends.{backend}.tools", "env"]
    extra = {"TF_CPP_MIN_LOG_LEVEL": "2"} if backend == "tf" else {}
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env(extra),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {
            "status": "broken",
            "detail": f"no answer within {timeout_s:g}s "
            f"(python -m dualtrain.backends.{backend}.tools env)",
        }
    except OSError as exc:
        return {"status": "broken", "detail": f"could not start {sys.executable}: {exc}"}
    if res.returncode != 0:
        return {"status": "broken", "detail": _last_line(res.stderr or res.stdout)}
    try:
        facts = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {
            "status": "broken",
            "detail": "tools env printed no JSON: " + _last_line(res.stdout),
        }
    return {"status": "ok", "facts": facts}


def collect(backends: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    """Core facts plus every named backend's, probed in parallel. The layout of summary.json's
    ``env`` ("core", "torch", "tf"), plus "backends": status per backend."""
    from dualtrain.records.envinfo import core_facts  # lazy: heavy (+25 ms on --help)

    probes: dict[str, dict[str, Any]] = {}

    def probe(name: str) -> None:
        probes[name] = probe_backend(name, timeout_s)

    threads = [threading.Thread(target=probe, args=(b,), daemon=True) for b in backends]
    for t in threads:
        t.start()
    out: dict[str, Any] = {"core": core_facts()}
    for t in threads:
        t.join()
    for b in backends:
        p = probes[b]
        out[b] = p.get("facts")
    out["backends"] = {b: {k: v for k, v in probes[b].items() if k != "facts"} for b in backends}
    return out


#: Facts whose name says which framework they belong to already: no "torch " prefix in the table.
_SELF_NAMED = {"torch", "tensorflow", "keras"}


def _rows(
    group: dict[str, Any], prefix: str = "", skip: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    from dualtrain.records.envinfo import show  # lazy: heavy (+25 ms on --help)

    rows = []
    for key, value in group.items():
        if key in skip:
            continue
        if isinstance(value, dict) and value and "name" not in value:
            rows += _rows(value, f"{prefix}{key} ")
        else:
            rows.append((key if key in _SELF_NAMED else f"{prefix}{key}", show(value)))
    return rows


def render(facts: dict[str, Any]) -> str:
    """The human-readable report: versions, devices, kernel settings; backends after the core."""
    from dualtrain.records.envinfo import (  # lazy: heavy (+25 ms on --help)
        BACKEND_PACKAGES,
        GROUPS,
        WATCHED_ENV,
        show,
    )

    core = facts["core"]
    status = facts.get("backends", {})
    answered = [b for b in BACKENDS if facts.get(b)]
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for key, title in GROUPS:
        rows = []
        if key == "settings":
            env = core.get("settings") or {}
            rows += [(f"env {k}", v) for k, v in env.items()]
            if not env:
                rows.append(("env", f"none of the {len(WATCHED_ENV)} watched variables is set"))
        elif key == "versions":
            rows += _rows(core.get(key) or {}, skip=("installed",))
            # Installed versions only where no backend process reported what it imported (a
            # missing package is named by its backend's row).
            reported = {p for b in answered for p in BACKEND_PACKAGES[b]}
            installed = (core.get(key) or {}).get("installed", {})
            rows += [(p, show(v)) for p, v in installed.items() if v and p not in reported]
        else:
            rows += _rows(core.get(key) or {})
        for b in BACKENDS:
            if b in answered:
                rows += _rows(facts[b].get(key) or {}, f"{b} ")
            elif b in status and key == "versions":
                rows.append((f"{b} backend", f"{status[b]['status']}: {status[b]['detail']}"))
        sections.append((title, rows))
    rows = [
        (f"{b} {dtype} {kind}", kernels.describe(facts[b]["kernels"], dtype, kind))
        for b in answered
        if facts[b].get("kernels")
        for dtype in kernels.DTYPES
        for kind in kernels.KINDS
    ]
    if rows:
        sections.append(("low-precision kernels (measured now: dualtrain.core.kernels)", rows))
    width = max(len(k) for _, rows in sections for k, _ in rows)
    lines = []
    for title, rows in sections:
        lines.append(title)
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    missing = [
        f"{b} ({status[b]['detail']})"
        for b in BACKENDS
        if status.get(b, {}).get("status") == "missing"
    ]
    broken = [b for b in BACKENDS if status.get(b, {}).get("status") == "broken"]
    if missing:
        lines.append(f"missing backends: {'; '.join(missing)}")
    if broken:
        lines.append(f"broken backends: {', '.join(broken)} (the error is under versions)")
    if answered:
        lines.append(
            "note: the framework settings above are a fresh process's defaults; each "
            "run's summary.json records what the run used (dualtrain turns TF32 off, and "
            "TF's oneDNN off except for bf16; docs/env.md)"
        )
    return "\n".join(lines)


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (core, torch, tf, backends) instead of the tables.",
)
@click.option(
    "--backend",
    "backend",
    type=str,
    default="all",
    metavar="torch|tf|all|none",
    help="Which backends to ask (each in its own subprocess; default all).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=120.0,
    metavar="SECONDS",
    help="How long a backend may take to answer (default 120).",
)
def env(as_json: bool, backend: str, timeout_s: float) -> None:
    """Show the facts that decide whether two runs compute the same numbers: versions (Python,
    NumPy, torch, TensorFlow, Keras, CUDA), devices (CPU model, cores, instruction sets, GPUs) and
    kernel settings (thread counts, oneDNN/MKL switches and ISA caps, TF32, determinism).

    \b
    Missing frameworks are reported, not an error (exit 0). Every run records the same facts in
    summary.json ("env"), and dualtrain compare lists those that differ. See docs/env.md.

    \b
    Examples:
      dualtrain env
      dualtrain env --json > env.json
      dualtrain env --backend torch
    """
    if backend not in CHOICES:
        raise UserError(f"--backend must be one of {', '.join(CHOICES)}. Received: {backend!r}")
    if not timeout_s > 0:
        raise UserError(f"--timeout must be a positive number of seconds. Received: {timeout_s:g}")
    names = BACKENDS if backend == "all" else (() if backend == "none" else (backend,))
    facts = collect(names, timeout_s)
    click.echo(json.dumps(facts, indent=2, default=str) if as_json else render(facts))
