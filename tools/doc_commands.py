"""Every ``dualtrain`` command the docs show, checked against the real command line (issue 49 item
6): each is parsed by the CLI's own click commands, so an option renamed or dropped fails; each
``--config`` the repository ships is loaded with the command's ``--set``, ``--world-size`` and
``--precision``, so a spec field renamed, a value refused or a config file moved fails.

    python -m tools.doc_commands          # every page's commands and what is wrong with them

Commands are the lines of code blocks (fenced or indented) that start with ``dualtrain`` (a
``$`` prompt allowed), with ``\\`` continuations joined and a trailing ``# comment`` dropped, and
the inline code spans of the prose that do. A
usage line's optional parts ``[...]`` are taken as given, and ``a|b`` as ``a``; a shell
redirection or pipe ends the command. Output lines
(``dualtrain compare: ...``) are not commands. A config that is the reader's own (``my.yaml``,
``spec.yaml``: not under configs/ or examples/) is parsed but not loaded.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from dualtrain.backends import parse_backend
from dualtrain.cli import cli
from dualtrain.cli.options import build_spec
from dualtrain.errors import UserError
from tools.prose import PAGES, ROOT

_FENCE = re.compile(r"^\s*(```|~~~)")
_COMMAND = re.compile(r"^\s*(?:\$\s+)?(dualtrain\s+[a-z-]+(?:\s.*)?)$")
_COMMENT = re.compile(r"\s+#\s.*$")
_INLINE = re.compile(r"`(dualtrain\s+[a-z-]+[^`]*)`")
#: folders whose configs ship with the repository: a command naming one must load
SHIPPED = ("configs/", "examples/", "tools/")


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    #: a sketch names a command and some options but is no full command line: an inline code span
    #: (`dualtrain export`), or a line with placeholders (`<config>`, `...`)
    sketch: bool = False

    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a code block."""
    out, fenced, previous_blank = [], False, True
    indented = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            out.append((n, line))
            continue
        indented = line.startswith("    ") and (previous_blank or indented) and bool(line.strip())
        if indented:
            out.append((n, line))
        previous_blank = not line.strip()
    return out


def commands(page: Path) -> list[Command]:
    found: list[Command] = []
    pending: tuple[int, str] | None = None
    for n, line in _code_lines(page.read_text()):
        if pending is not None:
            start, text = pending
            text += " " + line.strip()
        else:
            m = _COMMAND.match(line)
            if m is None or m.group(1).split()[1].endswith(":"):
                continue
            start, text = n, m.group(1)
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        text = _COMMENT.sub("", text).strip()
        sketch = any(mark in text for mark in ("<", "...", "[OPTIONS]"))
        found.append(Command(page, start, text, sketch=sketch))
    code = {n for n, _ in _code_lines(page.read_text())}
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if n not in code:
            found += [
                Command(page, n, m.group(1), sketch=True)
                for m in _INLINE.finditer(line)
                if not m.group(1).split()[1].endswith(":")  # an output line quoted
            ]
    return sorted(found, key=lambda c: c.line)


def _args(text: str) -> list[str]:
    text = re.sub(r"\[([^\[\]]*)\]", r"\1", text)  # a usage line's optional part, as given
    args = shlex.split(text)[1:]
    ends = [i for i, a in enumerate(args) if a in (">", ">>", "|", "&&", ";") or a.startswith("2>")]
    args = args[: ends[0]] if ends else args  # the shell's redirections and pipes are not ours
    return [a.split("|")[0] if "|" in a and not a.startswith("-") else a for a in args]


def _sketch_problem(args: list[str]) -> str | None:
    """A sketch's command and option names, each of which must exist."""
    sub = cli.commands.get(args[0])
    if sub is None:
        return f"no such command: {args[0]}"
    names = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [
        a.split("=")[0] for a in args[1:] if a.startswith("--") and a.split("=")[0] not in names
    ]
    return f"no such option: {unknown[0]}" if unknown else None


def problem(command: Command) -> str | None:
    """What is wrong with a documented command, or None."""
    try:
        args = _args(command.text)
    except ValueError as exc:
        return f"cannot be split as a shell line: {exc}"
    if command.sketch:
        return _sketch_problem(args)
    try:
        with cli.make_context("dualtrain", list(args), resilient_parsing=False) as group:
            name = args[0]
            sub = cli.get_command(group, name)
            if sub is None:
                return f"no such command: {name}"
            with sub.make_context(name, list(args[1:]), parent=group) as ctx:
                params = ctx.params
    except click.exceptions.Exit:
        return None  # --help, --version
    except click.ClickException as exc:
        return exc.format_message()
    config = params.get("config")
    try:
        if args[0] == "run" and params.get("backend"):  # env's --backend also takes all, none
            parse_backend(params["backend"])
        if not config or not str(config).startswith(SHIPPED):
            return None
        if not (ROOT / config).is_file():
            return f"{config} does not exist"
        build_spec(
            str(ROOT / config),
            params.get("world_size"),
            params.get("precision"),
            tuple(params.get("overrides", ())),
        )
    except UserError as exc:
        return str(exc)
    return None


def problems(pages: tuple[Path, ...] = PAGES) -> list[str]:
    return [
        f"{c.where()}: {c.text}\n    {p}"
        for page in pages
        for c in commands(page)
        if (p := problem(c)) is not None
    ]


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    total = sum(len(commands(p)) for p in PAGES)
    print(f"{total} documented commands, {len(found)} wrong")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
