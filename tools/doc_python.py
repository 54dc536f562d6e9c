"""Every Python block the docs show, checked against the real package (issue 49 item 6, the
Python half; tools/doc_commands.py checks the command lines):

* a block of code compiles, and each call of a dualtrain function names only keywords that
  function takes (a spec section for ``run`` and ``compare``'s overrides);
* a signature block (``dualtrain.run(spec, ..., *, out=None, ...) -> RunResult``) names the
  function's keyword parameters as it has them: the overloads of one function together name each
  keyword it takes, and none it does not;
* a session block (``>>> call`` then the error it prints) gives that error, word for word, when run.

    python -m tools.doc_python          # every page's Python blocks and what is wrong with them

Most blocks are parts of a user's script (``model``, ``x`` are the reader's): they are compiled,
not run. The tutorials' own scripts run in tests/integration/test_docs_tutorials.py.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import dualtrain
from dualtrain.spec.experiment import Experiment
from tools.prose import PAGES, ROOT, fenced

_SIGNATURE = re.compile(r"^(dualtrain(?:\.\w+)+)\((.*)\)\s*->\s*\w+$", re.S)
#: run's and compare's ``**overrides``: the spec's top-level sections
SECTIONS = frozenset(f.name for f in fields(Experiment))


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    text: str

    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def kind(self) -> str:
        if self.text.lstrip().startswith(">>>"):
            return "session"
        return "signature" if ") -> " in self.text else "code"


def blocks(page: Path) -> list[Block]:
    """The page's fenced ``python`` blocks, each with the line its code starts on."""
    return [
        Block(page, f.line, "\n".join(f.lines))
        for f in fenced(page.read_text())
        if f.lang == "python"
    ]


def resolve(dotted: str) -> Any:
    """``dualtrain.audit.torch_recorder`` as an object (None: no such name)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _dotted(node: ast.expr) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(names)])
    return None


def _takes(fn: Callable[..., Any], keyword: str) -> bool:
    params = inspect.signature(fn).parameters
    if keyword in params and params[keyword].kind != inspect.Parameter.POSITIONAL_ONLY:
        return True
    overrides = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    return overrides and keyword in SECTIONS


def code_mistakes(block: Block) -> list[str]:
    try:
        tree = ast.parse(block.text)
    except SyntaxError as exc:
        return [f"{block.where()}: does not compile: {exc.msg} (block line {exc.lineno})"]
    out = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = _dotted(call.func)
        if not name or not name.startswith("dualtrain."):
            continue
        fn = resolve(name)
        if fn is None:
            out.append(f"{block.where()}: {name} does not exist")
            continue
        for kw in call.keywords:
            if kw.arg is not None and not _takes(fn, kw.arg):
                out.append(f"{block.where()}: {name} takes no keyword {kw.arg}=")
    return out


def _keywords(params: str) -> set[str]:
    """The keyword-only names of a signature's parameter text (after its ``*``)."""
    star = re.search(r"(^|,)\s*\*\s*,", params)
    if not star:
        return set()
    named = re.findall(r"(?:^|,)\s*(\w+)\s*=", params[star.end() - 1 :])
    return set(named)


def signature_mistakes(page_blocks: list[Block]) -> list[str]:
    """Each function's documented keyword-only parameters, over all its overloads, against its
    real keyword-only parameters."""
    said: dict[str, tuple[Block, set[str]]] = {}
    for block in page_blocks:
        for text in re.split(r"\n(?=dualtrain\.)", block.text.strip()):
            m = _SIGNATURE.match(" ".join(text.split()))
            if m is None:
                continue
            first, names = said.get(m.group(1), (block, set()))
            said[m.group(1)] = (first, names | _keywords(m.group(2)))
    out = []
    for name, (block, names) in said.items():
        fn = resolve(name)
        if fn is None:
            out.append(f"{block.where()}: {name} does not exist")
            continue
        real = {
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind == inspect.Parameter.KEYWORD_ONLY
        }
        if names != real:
            extra, missing = sorted(names - real), sorted(real - names)
            out.append(
                f"{block.where()}: {name}'s keywords as documented differ from the function's "
                f"(documented only: {extra}; not documented: {missing})"
            )
    return out


def session_mistakes(block: Block) -> list[str]:
    """Run each ``>>>`` line; the line after it is the error it must print."""
    lines = block.text.strip().splitlines()
    out = []
    for call, said in zip(lines[::2], lines[1::2], strict=False):
        source = call.removeprefix(">>>").split("  #")[0].strip()
        try:
            eval(source, {"dualtrain": dualtrain})  # noqa: S307 (the docs' own lines)
            got = "no error"
        except Exception as exc:  # noqa: BLE001 (what a reader sees printed)
            got = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
        if got != said.strip():
            out.append(f"{block.where()}: {source} prints\n  {got}\nnot\n  {said.strip()}")
    return out


def mistakes(pages: tuple[Path, ...] = PAGES) -> list[str]:
    out = []
    for page in pages:
        found = blocks(page)
        for block in found:
            if block.kind == "code":
                out += code_mistakes(block)
            elif block.kind == "session":
                out += session_mistakes(block)
        out += signature_mistakes([b for b in found if b.kind == "signature"])
    return out


def main() -> int:
    found = mistakes()
    print("\n".join(found) or f"every Python block of {len(PAGES)} pages holds")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
