"""A tutorial's commands, run as a reader runs them, and the outputs it quotes checked against what
they print (issue 49 item 6): tests/integration/test_docs_tutorials.py.

A step is a ```bash block; the plain ``` block after it, before the next ```bash block, is what the
page quotes its last command printing. A quoted line is found when it is part of a printed line
once both are normalised: every number is ``#`` (times, throughput and accuracies move from machine
to machine; the words, checks and verdicts do not) and runs of spaces are one. A ``...`` line
stands for lines left out. ``make install`` and ``. .venv/bin/activate`` are the set-up, not
steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tools.prose import fenced

SETUP = ("make install", ". .venv/bin/activate")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?%?")


@dataclass
class Step:
    commands: list[str]
    quoted: list[str] = field(default_factory=list)


def steps(page: Path) -> list[Step]:
    out: list[Step] = []
    for block in fenced(page.read_text()):
        if block.lang == "bash":
            commands = [c for c in block.lines if c.strip() and c.strip() not in SETUP]
            if commands:
                out.append(Step(commands))
        elif block.lang == "" and out and not out[-1].quoted:
            out[-1].quoted = [q for q in block.lines if q.strip() and q.strip() != "..."]
    return out


def normal(line: str) -> str:
    return " ".join(_NUMBER.sub("#", line).split())


def missing(quoted: list[str], printed: str) -> list[str]:
    """The quoted lines that no printed line holds, once both are normalised."""
    lines = [normal(p) for p in printed.splitlines()]
    return [q for q in quoted if not any(normal(q.rstrip(".").rstrip()) in p for p in lines)]
