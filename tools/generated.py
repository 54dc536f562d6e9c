"""What the generated reference pages share (tools/reference_cli.py, tools/reference_tables.py):
the staleness check and the command line that prints, writes or checks a page."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def stale(path: Path, text: str, what: str, hint: str) -> list[str]:
    """One line when ``path`` does not hold ``text``: it is not what ``what`` says (a subject and
    its verb: "the code declares")."""
    if path.is_file() and path.read_text() == text:
        return []
    return [f"{path.name} is not what {what}: {hint}"]


def main(
    prog: str,
    doc: str | None,
    path: Path,
    page: Callable[[], str],
    problems: Callable[[], list[str]],
    argv: list[str] | None = None,
) -> int:
    """``prog``: print the page; ``--write`` writes it, ``--check`` exits 1 on a problem (both
    print the problems)."""
    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("--write", action="store_true", help=f"write docs/{path.name}")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when docs/{path.name} is stale")
    args = ap.parse_args(argv)
    if args.write:
        path.write_text(page())
    if args.check or args.write:
        found = problems()
        for line in found:
            print(line)
        return 1 if found else 0
    print(page())
    return 0
