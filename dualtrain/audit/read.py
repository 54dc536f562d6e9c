"""Reading a finished audit record (dualtrain.audit.record wrote it) for compare."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.audit.config import RunConfig
from dualtrain.audit.record import (
    AUDIT_FILE,
    METRICS_FILE,
    REPLICAS_FILE,
    WEIGHTS_FINAL,
    WEIGHTS_INIT,
)
from dualtrain.audit.rows import DigestKind, ReplicaRow, Series, StepRow
from dualtrain.errors import UserError


@dataclass(frozen=True)
class Script:
    """The script that recorded (audit.json's ``script``): its path, arguments and text, which the
    findings quote line by line (None: not a readable .py file, as under ``python -c``)."""

    path: str | None = None
    argv: tuple[str, ...] = ()
    text: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Script:
        return cls(d.get("path"), tuple(d.get("argv") or ()), d.get("text"))

    @property
    def name(self) -> str:
        return Path(self.path or "script").name

    def lines(self) -> list[str]:
        return (self.text or "").splitlines()


@dataclass
class Recorded:
    path: Path
    framework: str
    world_size: int
    config: RunConfig
    script: Script
    steps: list[StepRow]
    """metrics.jsonl's train rows, in step order."""
    replicas: dict[tuple[int, int], ReplicaRow]
    """(step, replica) -> replicas.jsonl's row."""
    weights_init: dict[str, np.ndarray] = field(repr=False)
    weights_final: dict[str, np.ndarray] = field(repr=False)
    pairings: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False, compare=False)
    """Its initial arrays' pairings with other records' (dualtrain.audit.pairing's, by the two
    weight sets): shared by the copies a fix's check makes (dataclasses.replace), which keep the
    weights, so a pairing by values is computed once per compare."""

    @property
    def label(self) -> str:
        return f"{self.framework} ({self.script_name})"

    @property
    def script_name(self) -> str:
        return self.script.name

    def rows(self, step: int) -> list[ReplicaRow]:
        return [
            self.replicas[(step, r)] for r in range(self.world_size) if (step, r) in self.replicas
        ]

    def global_rows(self, step: int, kind: DigestKind = "exact") -> Counter[str]:
        return Counter(d for row in self.rows(step) for d in row.digests(kind))

    def epochs(self) -> dict[int, list[int]]:
        """epoch -> its steps, in order; epochs counted from the run's first, 1 (a script that
        starts at ``initial_epoch=1`` or numbers its epochs from 0 trains epochs 1, 2, ...)."""
        out: dict[int, list[int]] = {}
        number: dict[int, int] = {}
        for s in self.steps:
            e = number.setdefault(s.epoch, len(number) + 1)
            out.setdefault(e, []).append(s.step)
        return out

    def epoch_of(self, step: int) -> int:
        """The epoch (counted as :meth:`epochs` counts them) of a step."""
        return next(e for e, steps in self.epochs().items() if step in steps)

    def series(self, key: Series) -> list[float | None]:
        return [s.value(key) for s in self.steps]

    def lr_changes(self) -> list[int]:
        """The steps whose lr is not the step before's."""
        lr = self.series("lr")
        return [i + 1 for i in range(1, len(lr)) if lr[i] != lr[i - 1]]

    def line_at(self, n: int) -> str | None:
        """``script.py:N: text`` of line ``n`` (where the recorder saw a call run)."""
        lines = self.script.lines()
        return f"{self.script_name}:{n}: {lines[n - 1].strip()}" if 0 < n <= len(lines) else None

    def line_of(self, *needles: str) -> str | None:
        """``script.py:LINE: text`` of the first line of the recorded script holding a needle."""
        code = code_lines(self.script.text or "")
        # a command-line option's definition names the setting but does not make it: the line
        # that builds the object first, the option's line only where no other holds the needle
        for lines in ([c for c in code if ARGUMENT not in c[1]], code):
            for needle in needles:
                for n, line in lines:
                    if needle in line:
                        return f"{self.script_name}:{n}: {line.strip()}"
        return None


#: an argparse option's definition
ARGUMENT = "add_argument("


def code_lines(text: str) -> list[tuple[int, str]]:
    """(number, line) of a script's statements: no docstrings, comments or imports."""
    out, quoted = [], False
    for n, line in enumerate(text.splitlines(), 1):
        bare = line.strip()
        toggles = bare.count('"""') + bare.count("'''")
        if quoted or toggles:
            quoted = quoted != (toggles % 2 == 1)
            continue
        if bare and not bare.startswith(("#", "import ", "from ")):
            out.append((n, line))
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def read_recorded(run_dir: str | Path) -> Recorded:
    """A finished audit record, or a one-line UserError (not one, or half-written)."""
    d = Path(run_dir)
    if not d.exists():
        raise UserError(f"audit record not found: {d} does not exist. Received: {str(d)!r}")
    if not (d / AUDIT_FILE).is_file():
        raise UserError(f"{d} is not an audit record (no {AUDIT_FILE}). Received: {str(d)!r}")
    meta = json.loads((d / AUDIT_FILE).read_text())
    if meta.get("state") != "complete":
        raise UserError(
            f"{d} is a half-written audit record (state {meta.get('state')!r}: the script "
            f"stopped before its recorder closed); record the run again. Received: {str(d)!r}"
        )
    metrics = [StepRow.of(m) for m in _jsonl(d / METRICS_FILE) if m.get("kind") == "train"]
    return Recorded(
        path=d,
        framework=meta["framework"],
        world_size=int(meta["world_size"]),
        config=RunConfig.from_json(meta.get("config") or {}),
        script=Script.from_json(meta.get("script") or {}),
        steps=sorted(metrics, key=lambda m: m.step),
        replicas={(r.step, r.replica): r for r in map(ReplicaRow.of, _jsonl(d / REPLICAS_FILE))},
        weights_init=_npz(d / WEIGHTS_INIT),
        weights_final=_npz(d / WEIGHTS_FINAL),
    )
