"""docs/reference.md, generated from the declarations the code already has (issue 49 item 4): every
layer type, every optimizer, the check functions of the compare verdict and every bound it
judges with, each with its words, so the page cannot go stale and no item can go without words.

    python -m tools.reference_tables            # print the page
    python -m tools.reference_tables --write    # write docs/reference.md
    python -m tools.reference_tables --check    # exit 1: the page is stale, or an item has no words

Where the words come from:

* a layer type: its ``#:`` comment on ``LayerType`` (dualtrain/spec/vocab.py); its fields and
  defaults from ``KINDS`` (dualtrain/spec/layers.py), its aliases from ``ALIASES``;
* an optimizer: its ``#:`` comment on ``OptimizerName``; its options from ``OPTIMIZERS``
  (dualtrain/spec/optimizers.py) with ``OptimizerSpec``'s defaults, its Keras names from
  ``KERAS_NAMES``, whose options carry their own words;
* a check function of dualtrain.parity.checks (``check_*`` in its ``__all__``): its docstring;
* a bound: its attribute docstring in dualtrain/parity/tolerances.py (``REFERENCE``,
  ``TOLERANCES``, ``LOCAL``); a constant of the checks' modules: its ``#:`` comment.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import math
import pkgutil
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dualtrain.parity import checks as verdict_checks
from dualtrain.parity import tolerances as tol
from dualtrain.parity.checks.declared import CHECKS as CHECK_ORDER
from dualtrain.parity.checks.declared import Declared as DeclaredCheck
from dualtrain.spec import OptimizerSpec
from dualtrain.spec.layers import KINDS, REQUIRED, Kind
from dualtrain.spec.optimizers import KERAS_NAMES, OPTIMIZERS, KerasName, Optimizer
from dualtrain.spec.vocab import ALIASES, LayerType, OptimizerName
from tools import generated
from tools.reference import DOC_LINK, docstrings, yaml_text

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference.md"
WRITE_HINT = "run `python -m tools.reference_tables --write`"
#: a Sphinx role before a code span in a docstring: ``:func:`x``` reads as ```x```
ROLE = re.compile(r":(?:func|data|class|meth|mod|attr):`~?")
CODE_SPAN = re.compile(r"(`[^`]*`)")
#: the field of a bounds row that names its column (not a bound)
KEY_FIELD = "precision"
REFERENCE_ABOUT = """### The fp64 reference pair: `REFERENCE`

The bounds of the semantics checks. Two float64 runs of one spec, one on each backend, agree to
rounding.
"""
TOLERANCES_ABOUT = """### The whole-run numerics: `TOLERANCES`

One column a precision. Two runs of different precisions take the stricter column.
"""
LOCAL_ABOUT = """### The one-step probes and convergence: `LOCAL`

One column a precision. `u` is the compute precision's unit roundoff, written as a power of two.
"""


@dataclass(frozen=True)
class Bounds:
    """One table of bounds: ``cls``'s fields, a column per instance of ``columns``; ``about``:
    the table's heading and the words above it."""

    cls: type
    columns: Mapping[str, Any]
    about: str


@dataclass(frozen=True)
class Declared:
    """What the page is generated from (a test plants its own)."""

    layer_types: type[enum.Enum] = LayerType
    kinds: Mapping[Any, Kind] = dataclasses.field(default_factory=lambda: KINDS)
    aliases: Mapping[str, str] = dataclasses.field(default_factory=lambda: ALIASES["LayerType"])
    optimizer_names: type[enum.Enum] = OptimizerName
    optimizers: Mapping[Any, Optimizer] = dataclasses.field(default_factory=lambda: OPTIMIZERS)
    keras_names: Mapping[str, KerasName] = dataclasses.field(default_factory=lambda: KERAS_NAMES)
    checks: tuple[Callable[..., Any], ...] = tuple(
        getattr(verdict_checks, n) for n in sorted(verdict_checks.__all__) if n.startswith("check_")
    )
    order: tuple[DeclaredCheck, ...] = CHECK_ORDER
    bounds: tuple[Bounds, ...] = (
        Bounds(tol.ReferenceBound, {"value": tol.REFERENCE}, REFERENCE_ABOUT),
        Bounds(tol.Tolerance, tol.TOLERANCES, TOLERANCES_ABOUT),
        Bounds(tol.LocalBound, tol.LOCAL, LOCAL_ABOUT),
    )
    modules: tuple[ModuleType, ...] = tuple(
        importlib.import_module(f"{verdict_checks.__name__}.{m.name}")
        for m in pkgutil.iter_modules(verdict_checks.__path__)
    )


DECLARED = Declared()


# ---- the words: #: comments, docstrings ---------------------------------------------------------


def target(stmt: ast.stmt) -> str | None:
    """The name a statement assigns (``X = ...``, ``X: int = ...``), or None."""
    node = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
    return node.id if isinstance(node, ast.Name) else None


def _comments(body: list[ast.stmt], lines: list[str]) -> dict[str, str]:
    found = {}
    for stmt in body:
        above: list[str] = []
        i, name = stmt.lineno - 2, target(stmt)
        while name and i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if name and above:
            found[name] = " ".join(above)
    return found


def comment_words(owner: type | ModuleType) -> dict[str, str]:
    """Each name assigned in ``owner`` (a class or a module) with the ``#:`` comment right above
    it: the words Sphinx reads for an enum member or a constant."""
    source = inspect.getsourcefile(owner)
    if source is None:
        return {}
    text = Path(source).read_text()
    tree, lines = ast.parse(text), text.splitlines()
    if isinstance(owner, ModuleType):
        return _comments(tree.body, lines)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == owner.__name__:
            return _comments(node.body, lines)
    return {}


def _link(match: re.Match[str]) -> str:
    return f"[{match[1]}]({match[1]}{match[2] or ''})"


def cell(text: str) -> str:
    """Words for one table cell: one line, ``code`` as Markdown's `code` (a Sphinx role dropped),
    a docs page as a link, ``|`` escaped, ``<`` escaped outside code."""
    text = ROLE.sub("`", " ".join(text.split()).replace("``", "`"))
    text = DOC_LINK.sub(_link, text).replace("|", r"\|")
    parts = CODE_SPAN.split(text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts)


def number(value: Any) -> str:
    """A bound as the code declares it: ``1e-10``, ``32``, a small power of two as ``2^-24``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return yaml_text(value)
    if isinstance(value, float) and 0 < value <= 2.0**-8 and math.log2(value).is_integer():
        return f"2^{int(math.log2(value))}"
    return f"{value:g}"


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


# ---- the tables ---------------------------------------------------------------------------------


def _field(name: str, default: Any) -> str:
    if default is REQUIRED:
        return f"`{name}` (required)"
    return f"`{name}`" if default is None else f"`{name}: {yaml_text(default)}`"


def layer_table(d: Declared = DECLARED) -> str:
    words = comment_words(d.layer_types)
    rows = []
    for t, kind in d.kinds.items():
        fields = ", ".join(_field(n, v) for n, v in kind.fields.items()) or "-"
        aliases = ", ".join(f"`{a}`" for a, v in sorted(d.aliases.items()) if v == t.value != a)
        rows.append((f"`{t.value}`", fields, aliases or "-", cell(words.get(t.name, ""))))
    return _table(("type", "fields", "aliases", "meaning"), rows)


def _option(name: str, opt: Optimizer) -> str:
    default = opt.default_eps if name == "eps" else getattr(OptimizerSpec(name=opt.name), name)
    return f"`{name}: {yaml_text(default)}`"


def _keras(names: KerasName, only: tuple[str, ...]) -> str:
    """The Keras class, and each of ``only`` (the options) that Keras names differently."""
    renamed = [f"`{t}` as `{k}`" for t, k, _ in names.options if t != k and t.split(".")[0] in only]
    return f"`{names.keras_class}`" + (": " + ", ".join(renamed) if renamed else "")


def optimizer_table(d: Declared = DECLARED) -> str:
    words = comment_words(d.optimizer_names)
    rows = []
    for name, opt in d.optimizers.items():
        keras = d.keras_names.get(opt.torch_class)
        rows.append(
            (
                f"`{name.value}`",
                f"`{opt.torch_class}`",
                _keras(keras, opt.options) if keras else "-",
                ", ".join(_option(o, opt) for o in opt.options),
                cell(words.get(name.name, "")),
            )
        )
    return _table(("optimizer", "torch.optim", "Keras", "options", "meaning"), rows)


def common_options(d: Declared = DECLARED) -> list[str]:
    """The OptimizerSpec fields every optimizer takes: no optimizer lists them as its own."""
    own = {o for opt in d.optimizers.values() for o in opt.options} | {"name"}
    return [f.name for f in dataclasses.fields(OptimizerSpec) if f.name not in own]


def script_optimizer_table(d: Declared = DECLARED) -> str:
    rows = []
    for torch_class, names in d.keras_names.items():
        options = []
        for t, k, what in names.options:
            shown = f"`{t}`" if t == k else f"`{t}` as `{k}`"
            options.append(shown if what in (t, k) else f"{shown}: {cell(what)}")
        rows.append((f"`{torch_class}`", f"`{names.keras_class}`", "; ".join(options)))
    return _table(("torch.optim", "Keras", "options both take"), rows)


def check_table(d: Declared = DECLARED) -> str:
    """A row a check, in report order: its name, group and bounds, and the function that makes it
    with the function's docstring."""
    functions = {fn.__name__: fn for fn in d.checks}
    rows = [
        (
            f"`{c.name}`",
            c.group,
            ", ".join(f"`{b}`" for b in c.bounds) or "-",
            f"`{c.function}`",
            cell(inspect.getdoc(functions[c.function]) or "" if c.function in functions else ""),
        )
        for c in d.order
    ]
    return _table(("check", "group", "bounds", "function", "meaning"), rows)


def bounds_table(b: Bounds) -> str:
    words = docstrings(b.cls)
    rows = [
        (f"`{f.name}`", *(number(getattr(v, f.name)) for v in b.columns.values()))
        + (cell(words.get(f.name, "")),)
        for f in dataclasses.fields(b.cls)
        if f.name != KEY_FIELD
    ]
    return _table(("bound", *b.columns, "meaning"), rows)


def constants(d: Declared = DECLARED) -> list[tuple[ModuleType, str, Any]]:
    """(module, ``module.NAME``, value) of each public numeric constant the checks' modules
    assign."""
    return [
        (m, f"{m.__name__.rsplit('.', 1)[-1]}.{name}", value)
        for m in d.modules
        for name, value in vars(m).items()
        if name.isupper() and type(value) in (int, float) and name in assigned(m)
    ]


def assigned(m: ModuleType) -> set[str]:
    """The names module ``m`` assigns at its top level (not those it imports)."""
    tree = ast.parse(Path(inspect.getsourcefile(m) or "").read_text())
    return {name for s in tree.body if (name := target(s))}


def constant_table(d: Declared = DECLARED) -> str:
    rows = [
        (f"`{name}`", number(value), cell(comment_words(m).get(name.rsplit(".")[-1], "")))
        for m, name, value in constants(d)
    ]
    return _table(("constant", "value", "meaning"), rows)


# ---- the page -----------------------------------------------------------------------------------

INTRO = f"""# Layers, optimizers and checks

<!-- generated by tools/reference_tables.py from dualtrain/spec/ and dualtrain/parity/: \
{WRITE_HINT} after a change -->

The layer types, the optimizers, and the checks and bounds of the compare verdict, as the code
declares them. Every row's words are the code's own. A test fails when an item has no words, or
when this page differs from the code.
"""
LAYERS = """## Layer types

Each type of `model.layers`: the fields it takes, and what it does. A value after a field is its
default. A field without a value has a default that its words give in
[the spec's layer table](spec.md#modellayers). An alias is a framework's name for the type, which
the spec reads in any letter case.
"""
OPTIMIZERS_TEXT = """## Optimizers

Each `optimizer.name`, with torch.optim's semantics on both backends. Its options are the fields
its torch.optim class takes, with their defaults. `eps` defaults to torch's value for the
optimizer. Every optimizer also takes
{common}. Each option's words are in [the spec's optimizer table](spec.md#optimizer). The Keras
column names the Keras class, and each option that Keras names differently.
"""
SCRIPTS = """### The optimizers of your own scripts

The audit compares a torch script's optimizer with a Keras script's through this table. Each row is
a torch.optim class and its Keras counterpart, with the options both take.
"""
CHECKS = """## Checks

Each check of a compare, in the report's order, from `dualtrain/parity/checks/declared.py`: its
name, its group, the bounds it holds the runs to ([below](#bounds)), and the function that makes
it, with the function's docstring. A check without bounds compares exactly, as its meaning says,
or only informs. The groups are explained in
[the report's page](report.md#the-checks-in-three-groups).
"""
BOUNDS = """## Bounds

Every threshold of the verdict, from `dualtrain/parity/tolerances.py`.
[parity.md §7](parity.md#7-the-compare-checks-and-the-tolerance-table) gives the measurements
behind each number. A small power of two is written `2^-n`.
"""
CONSTANTS = """### The constants of the checks

Numbers that the checks' modules declare beside the bounds.
"""


def page(d: Declared = DECLARED) -> str:
    names = [f"`{n}`" for n in common_options(d)]
    common = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    parts = [INTRO, LAYERS, layer_table(d), OPTIMIZERS_TEXT.format(common=common)]
    parts += [optimizer_table(d), SCRIPTS, script_optimizer_table(d), CHECKS, check_table(d)]
    parts += [BOUNDS, *(text for b in d.bounds for text in (b.about, bounds_table(b)))]
    return "\n".join([*parts, CONSTANTS, constant_table(d)])


def missing_words(d: Declared = DECLARED) -> list[str]:
    """Every declared item without words, named."""
    layer_words, opt_words = comment_words(d.layer_types), comment_words(d.optimizer_names)
    out = [f"layer type {t.value}" for t in d.kinds if not layer_words.get(t.name)]
    out += [f"optimizer {n.value}" for n in d.optimizers if not opt_words.get(n.name)]
    out += [
        f"KERAS_NAMES[{c!r}] option {t}"
        for c, names in d.keras_names.items()
        for t, _, what in names.options
        if not what.strip()
    ]
    out += [f"check function {fn.__name__}" for fn in d.checks if not inspect.getdoc(fn)]
    made = {c.function for c in d.order}
    out += [f"check function {fn.__name__} (no check declares it)" for fn in d.checks
            if fn.__name__ not in made]  # fmt: skip
    functions = {fn.__name__ for fn in d.checks}
    out += [f"check {c.name} (its function {c.function} is no check function)" for c in d.order
            if c.function not in functions]  # fmt: skip
    fields = {f"{name}.{f.name}" for name, cls in (("REFERENCE", tol.ReferenceBound),
              ("TOLERANCES", tol.Tolerance), ("LOCAL", tol.LocalBound))
              for f in dataclasses.fields(cls)}  # fmt: skip
    out += [f"check {c.name} bound {b} (no such bound)" for c in d.order for b in c.bounds
            if b not in fields]  # fmt: skip
    for b in d.bounds:
        words = docstrings(b.cls)
        out += [
            f"bound {b.cls.__name__}.{f.name}"
            for f in dataclasses.fields(b.cls)
            if f.name != KEY_FIELD and not words.get(f.name, "").strip()
        ]
    out += [
        f"constant {name}"
        for m, name, _ in constants(d)
        if not comment_words(m).get(name.rsplit(".")[-1])
    ]
    return out


def problems(path: Path = PAGE, d: Declared = DECLARED) -> list[str]:
    found = [f"no words: {m}" for m in missing_words(d)]
    return found + generated.stale(path, page(d), "the code declares", WRITE_HINT)


def main(argv: list[str] | None = None) -> int:
    return generated.main("python -m tools.reference_tables", __doc__, PAGE, page, problems, argv)


if __name__ == "__main__":
    sys.exit(main())
