"""docs/spec.md's field tables, generated from the spec's declarations (issue 49 item 4), so a table
cannot go stale and a field cannot go without words.

    python -m tools.reference            # print every section's table
    python -m tools.reference --write    # rewrite the tables of docs/spec.md in place
    python -m tools.reference --check    # exit 1 when a table is stale or a field has no words

A section is a dataclass reached from :class:`~dualtrain.spec.Experiment`, named by its shortest
path: ``data``, ``model.layers[]`` (an item of a list), ``(top level)`` for the Experiment itself.
Its table in docs/spec.md stands between two marker comments, the rest of the page is written by
hand and left as it is::

    <!-- generated: tools/reference.py spec data -->
    | field | type | default | meaning |
    ...
    <!-- end generated -->

Each row is one field: its name, its type written for a reader (an enum's values, ``null`` for
None, ``list of ...``), its default as YAML shows it, and its words: the attribute docstring, the
string literal right after the field in the source, read with ``ast``. A layer's defaults are its
types' (dualtrain.spec.layers.KINDS): ``required`` where a type must be given the field, ``-``
where the type's own default is said in words.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import operator
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dualtrain.spec import Experiment, LayerSpec
from dualtrain.spec.layers import KINDS, REQUIRED

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "spec.md"
TOP = "(top level)"
BEGIN = "<!-- generated: tools/reference.py spec {} -->"
END = "<!-- end generated -->"
BLOCK = re.compile(
    r"<!-- generated: tools/reference\.py spec (?P<path>[^>\n]+?) -->\n.*?" + re.escape(END), re.S
)
#: a docs page named in a docstring (``docs/data.md``, ``docs/data.md#several-inputs``): a link
DOC_LINK = re.compile(r"(?<![\w/.])docs/([\w-]+\.md)(#[\w-]+)?")
HEADER = "| field | type | default | meaning |\n|---|---|---|---|\n"
WRITE_HINT = "run `python -m tools.reference --write`"


@dataclass(frozen=True)
class Section:
    """One dataclass of the spec at its path; ``given``: its values as its parent's default
    builds it, where that default is not the class's own (``model``: ``ModelSpec(preset="mlp")``).
    """

    path: str
    cls: type
    given: dict[str, Any] = dataclasses.field(default_factory=dict)

    def field_path(self, name: str) -> str:
        return name if self.path == TOP else f"{self.path}.{name}"


def section_type(tp: Any) -> tuple[type | None, bool]:
    """The dataclass a field's type holds, and whether as a list: ``EmaSpec | None`` -> (EmaSpec,
    False), ``tuple[LayerSpec, ...]`` -> (LayerSpec, True), ``int`` -> (None, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return section_type(inner[0]) if len(inner) == 1 else (None, False)
    if dataclasses.is_dataclass(tp):
        return typing.cast(type, tp), False
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        if dataclasses.is_dataclass(args[0]):
            return typing.cast(type, args[0]), True
    return None, False


def sections(root: type = Experiment) -> list[Section]:
    """Every dataclass reached from ``root``, once each, at its shortest path (breadth first)."""
    out: list[Section] = []
    seen = {root}
    queue = [Section(TOP, root)]
    while queue:
        section = queue.pop(0)
        out.append(section)
        hints = typing.get_type_hints(section.cls)
        for f in dataclasses.fields(section.cls):
            cls, many = section_type(hints[f.name])
            if cls is None or cls in seen:
                continue
            seen.add(cls)
            factory = f.default_factory
            given = {}
            if factory is not dataclasses.MISSING and factory is not cls:
                built = factory()
                given = {g.name: getattr(built, g.name) for g in dataclasses.fields(cls)}
            path = section.field_path(f.name) + ("[]" if many else "")
            queue.append(Section(path, cls, given))
    return out


@functools.cache
def _class_nodes(source_file: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse(Path(source_file).read_text())
    nodes: dict[str, ast.ClassDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            nodes.setdefault(node.name, node)
    return nodes


def docstrings(cls: type) -> dict[str, str]:
    """Each field's words: the string literal right after its annotated assignment in ``cls``'s
    source (an attribute docstring), cleaned of its indentation."""
    source = inspect.getsourcefile(cls)
    node = _class_nodes(source).get(cls.__name__) if source else None
    if node is None:
        return {}
    found = {}
    for stmt, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[stmt.target.id] = inspect.cleandoc(after.value.value)
    return found


def type_text(tp: Any, names: dict[type, str]) -> str:
    """A field's type for a reader: ``int``, ``float | null``, ``list of float``, an enum's values
    (``fp32 | fp16 | bf16 | fp64``), ``mapping`` for a section, ``list of `data.stats[]``` for a
    list of sections (named by their table)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a, names) for a in args if a is not type(None)]
        return " | ".join(parts + (["null"] if type(None) in args else []))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(str(m.value) for m in tp)
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = args[0]
            return f"list of `{names[item]}`" if item in names else f"list of {type_text(item, {})}"
        return "[" + ", ".join(type_text(a, names) for a in args) + "]"
    if origin is list:
        return f"list of {type_text(args[0], names)}"
    if origin is dict:
        return f"mapping of {type_text(args[0], names)} to {type_text(args[1], names)}"
    if tp is Any:
        return "any"
    return str(getattr(tp, "__name__", tp))


def plain(value: Any) -> Any:
    """``value`` as the spec's YAML holds it: enums by value, tuples as lists, sections as
    mappings."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def yaml_text(value: Any) -> str:
    """``value`` as YAML writes it in one line: ``128``, ``null``, ``1.0e-05``, ``[0.9, 0.999]``."""
    text = yaml.safe_dump(plain(value), default_flow_style=True, sort_keys=False, width=10**6)
    text = text.strip()
    return text[: -len("...")].strip() if text.endswith("\n...") else text


def layer_default(name: str) -> str | None:
    """A layer field's default from the types that take it (KINDS): its value, ``required``, or
    ``-`` (each type's own default, said in words); None for a field no type declares."""
    values = [kind.fields[name] for kind in KINDS.values() if name in kind.fields]
    if not values:
        return None
    known = list(dict.fromkeys(yaml_text(v) for v in values if v is not REQUIRED and v is not None))
    if known:
        return " or ".join(f"`{v}`" for v in known)
    return "required" if all(v is REQUIRED for v in values) else "-"


def default_text(section: Section, f: dataclasses.Field[Any]) -> str:
    if section.cls is LayerSpec:
        per_type = layer_default(f.name)
        if per_type is not None:
            return per_type
    if f.name in section.given:
        value = section.given[f.name]
    elif f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "-"  # a section: its own table gives its defaults
    return f"`{yaml_text(value)}`"


def _link(match: re.Match[str]) -> str:
    page, anchor = match[1], match[2] or ""
    if page == PAGE.name and anchor:
        return f"[below]({anchor})"
    return f"[{page}]({page}{anchor})"


def cell(text: str) -> str:
    """Words for one table cell: on one line, ``code`` as Markdown's `code`, a docs page as a
    link, a ``|`` escaped."""
    text = " ".join(text.split()).replace("``", "`")
    return DOC_LINK.sub(_link, text).replace("|", r"\|")


def table(section: Section, names: dict[type, str]) -> str:
    """The section's Markdown table: one row a field, in declaration order."""
    hints = typing.get_type_hints(section.cls)
    words = docstrings(section.cls)
    rows = []
    for f in dataclasses.fields(section.cls):
        tp = hints[f.name]
        if section.cls is LayerSpec and layer_default(f.name) is not None:
            tp = without_null(tp)  # null there is "unset": the type's default or a refusal
        rows.append(
            f"| `{f.name}` | {cell(type_text(tp, names))} | {default_text(section, f)} | "
            f"{cell(words.get(f.name, ''))} |\n"
        )
    return HEADER + "".join(rows)


def without_null(tp: Any) -> Any:
    """``tp`` less its ``None``: ``int | None`` -> ``int``."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return tp
    inner = tuple(a for a in typing.get_args(tp) if a is not type(None))
    return functools.reduce(operator.or_, inner)


def tables(root: type = Experiment) -> dict[str, str]:
    """Every section's table by its path, breadth first (:func:`sections`)."""
    found = sections(root)
    names = {s.cls: s.path for s in found}
    return {s.path: table(s, names) for s in found}


def missing_words(root: type = Experiment) -> list[str]:
    """The path of every field reached from ``root`` that has no attribute docstring."""
    return [
        s.field_path(f.name)
        for s in sections(root)
        for f in dataclasses.fields(s.cls)
        if not docstrings(s.cls).get(f.name, "").strip()
    ]


def block(path: str, rows: str) -> str:
    """A generated table with its markers, blank lines around the table (a comment line right
    above a table would keep some Markdown readers from seeing the table)."""
    return f"{BEGIN.format(path)}\n\n{rows}\n{END}"


def render(text: str, root: type = Experiment) -> str:
    """``text`` (docs/spec.md) with every generated table written anew; the rest as it is."""
    generated = tables(root)

    def fill(match: re.Match[str]) -> str:
        path = match["path"]
        if path not in generated:
            raise KeyError(f"{path!r} names no spec section (known: {', '.join(generated)})")
        return block(path, generated[path])

    return BLOCK.sub(fill, text)


def problems(page: Path = PAGE, root: type = Experiment) -> list[str]:
    """What is wrong with ``page``'s tables: a section without one, a table of no section or twice,
    a table that differs from what :func:`render` writes. Empty: the page is up to date."""
    text = page.read_text()
    generated = tables(root)
    paths = [m["path"] for m in BLOCK.finditer(text)]
    out = [
        f"{p}: no generated table in {page.name}; add {BEGIN.format(p)} and {END} where it goes"
        for p in generated
        if p not in paths
    ]
    out += [f"{p}: a generated table of no spec section" for p in paths if p not in generated]
    out += [f"{p}: two generated tables" for p in dict.fromkeys(paths) if paths.count(p) > 1]
    if out:
        return out
    stale = [
        m["path"] for m in BLOCK.finditer(text) if m[0] != block(m["path"], generated[m["path"]])
    ]
    return [f"{p}: the table differs from the spec's declarations; {WRITE_HINT}" for p in stale]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite docs/spec.md's tables")
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/spec.md is stale")
    args = parser.parse_args(argv)
    unsaid = [f"{p}: no words (an attribute docstring in the code)" for p in missing_words()]
    if args.write:
        placed = [p for p in problems() if WRITE_HINT not in p]
        if placed:
            print("\n".join(placed), file=sys.stderr)
            return 1
        PAGE.write_text(render(PAGE.read_text()))
        print(f"wrote {PAGE.relative_to(ROOT)}")
    elif args.check:
        found = problems() + unsaid
        if found:
            print(f"{PAGE.relative_to(ROOT)}:\n" + "\n".join(found), file=sys.stderr)
            return 1
        print(f"{PAGE.relative_to(ROOT)} is what the spec declares")
    else:
        for path, text in tables().items():
            print(f"## `{path}`\n\n{text}")
    if unsaid and not args.check:
        print("\n".join(unsaid), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
