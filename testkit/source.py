"""Reading the project's own source (ast, no import): which modules a file imports, its import
cycles, the project's files by tree. tests/package's gates read the code through these."""

from __future__ import annotations

import ast
from pathlib import Path

from testkit.cli import ROOT

PKG = ROOT / "dualtrain"
TOOLS = ROOT / "tools"
#: every tree of the project's Python code: the package, then what runs beside it
TREES = ("dualtrain", "tools", "testkit", "tests", "parity_tests", "bench")
#: the top-level names a project module is imported by
ROOTS = ("dualtrain", "tools", "testkit", "tests", "parity_tests", "bench")


def project_files(*trees: str) -> list[Path]:
    """Every .py file of the named trees (all of TREES when none is named)."""
    return sorted(p for t in (trees or TREES) for p in (ROOT / t).rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def dualtrain_imports(path: Path, source: str | None = None, module: str | None = None) -> set[str]:
    """Every dualtrain module ``path`` imports, at module level or inside a function (type-only
    imports included: a layer must not even name a higher one)."""
    tree = ast.parse(path.read_text() if source is None else source)
    me = module or module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "dualtrain"}
        elif isinstance(node, ast.ImportFrom):
            mod = imported_from(node, package)
            if mod.split(".")[0] == "dualtrain":
                found.add(mod)
                # `from dualtrain.core import plan` names the module dualtrain.core.plan
                found |= {f"{mod}.{a.name}" for a in node.names if is_module(f"{mod}.{a.name}")}
    return found - {me}


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` statement in ``package`` names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among modules (one per strongly connected component of size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
