"""The code's hygiene, in every tree of the project (the package, tools/, testkit/, tests/,
parity_tests/, bench/): no private name crosses a module, an import inside a function says why
(package and tools), sizes within their limits, one name per test file."""

import ast
import re
from collections import defaultdict
from pathlib import Path

from testkit.cli import ROOT
from testkit.source import (
    PKG,
    ROOTS,
    TOOLS,
    cycles,
    imported_from,
    is_module,
    module_name,
    project_files,
)

# ---- an honest graph: no private name crosses a module, in any tree; no cycle in the tools ------


def private_crossings(path: Path, source: str | None = None) -> list[str]:
    """Each single-underscore name ``path`` takes from another module of the project (dualtrain,
    tools, testkit, tests, ...): imported by name, or read as an attribute of a module it
    imported."""
    tree = ast.parse(path.read_text() if source is None else source)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = imported_from(node, package)
            if mod.split(".")[0] not in ROOTS or mod == me:
                continue
            for a in node.names:
                if is_module(f"{mod}.{a.name}"):
                    modules[a.asname or a.name] = f"{mod}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{me} imports {a.name} from {mod}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ROOTS and a.asname:
                    modules[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{me} reads {modules[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    """A name another module needs is public (or moves to where it is used): the package, the
    tools, the test kit and the tests alike (a test reads what a user or another module could)."""
    found = [line for path in project_files() for line in private_crossings(path)]
    assert not found, "\n".join(found)


def test_the_private_check_sees_a_crossing():
    source = (
        "from dualtrain.parity.checks.base import _planted\n"
        "from dualtrain.parity.checks import base\n"
        "x = base._hidden\n"
    )
    assert private_crossings(PKG / "parity" / "checks" / "planted.py", source) == [
        "dualtrain.parity.checks.planted imports _planted from dualtrain.parity.checks.base",
        "dualtrain.parity.checks.planted reads dualtrain.parity.checks.base._hidden",
    ]


def tools_imports(path: Path) -> set[str]:
    """The tools modules ``path`` imports (module level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "tools"
        ):
            found.add(node.module)
            found |= {
                f"{node.module}.{a.name}" for a in node.names if (TOOLS / f"{a.name}.py").exists()
            }
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tools"}
    return found - {module_name(path)}


def test_no_import_cycle_in_the_tools_either():
    graph = {module_name(p): tools_imports(p) - {"tools"} for p in sorted(TOOLS.rglob("*.py"))}
    assert not cycles(graph), cycles(graph)


# ---- imports inside a function: only for a reason, and the reason named ------------------------

#: Why an import may sit inside a function, named on its first line as ``# lazy: <reason> ...``:
#: framework (torch, TensorFlow or Keras, kept out of a module that must stay framework-free at
#: import time), heavy (a slow import kept off the CLI's start-up path), optional (a package that
#: may be absent), user code (the user's own module), cycle (an import cycle, to be fixed).
LAZY_MARKER = re.compile(r"#\s*lazy:\s*(framework|heavy|optional|user code|cycle)\b")


def unmarked_function_imports(path: Path, source: str | None = None) -> list[str]:
    """Each import inside a function of ``path`` (methods and nested functions included) whose
    first line has no ``# lazy: <reason>`` marker, as ``file:line statement``."""
    text = path.read_text() if source is None else source
    lines = text.splitlines()
    found = {}
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    first = lines[node.lineno - 1]
                    if not LAZY_MARKER.search(first):
                        found[node.lineno] = first.strip()
    rel = path.relative_to(ROOT)
    return [f"{rel}:{n} {line}" for n, line in sorted(found.items())]


def test_an_import_inside_a_function_says_why():
    """An import is at module level (the module's real dependencies, read at a glance) unless a
    marker on its first line says why not."""
    found = [
        line
        for path in project_files("dualtrain", "tools")
        for line in unmarked_function_imports(path)
    ]
    assert not found, (
        "an import inside a function without a `# lazy: framework|heavy|optional|user code|cycle` "
        "marker: move it to the module's imports, or say why it waits:\n" + "\n".join(found)
    )


def test_the_lazy_import_check_sees_an_unmarked_import():
    source = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    import torch  # lazy: framework\n"
        "    from dualtrain import (  # lazy: because\n"
        "        api,\n"
        "    )\n"
        "    def g():\n"
        "        from dualtrain.core import pair\n"
        "class C:\n"
        "    def m(self):\n"
        "        import matplotlib  # lazy: heavy (~300 ms)\n"
        "        from sklearn import (\n"
        "            datasets,  # lazy: optional\n"
        "        )\n"
    )
    assert unmarked_function_imports(PKG / "core" / "planted.py", source) == [
        "dualtrain/core/planted.py:3 import json",
        "dualtrain/core/planted.py:5 from dualtrain import (  # lazy: because",
        "dualtrain/core/planted.py:9 from dualtrain.core import pair",
        "dualtrain/core/planted.py:13 from sklearn import (",
    ]


# ---- modules that do one thing: sizes ------------------------------------------------------------

#: The limits (lines, decorators excluded): a module, a class, a function.
LIMITS = {"module": 400, "class": 250, "function": 80}
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def oversize(path: Path, source: str | None = None) -> dict[tuple[str, str, str], int]:
    """(file, kind, name) -> lines for everything in ``path`` over its limit."""
    text = path.read_text() if source is None else source
    rel = str(path.relative_to(ROOT))
    out = {}
    n = len(text.splitlines())
    if n > LIMITS["module"]:
        out[(rel, "module", "")] = n
    for node in ast.walk(ast.parse(text)):
        kind = (
            "class"
            if isinstance(node, ast.ClassDef)
            else "function"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            else None
        )
        if kind is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > LIMITS[kind]:
                out[(rel, kind, node.name)] = lines
    return out


def declared_exceptions() -> dict[tuple[str, str, str], int]:
    """docs/architecture.md's "Size limits" table: (file, kind, name) -> the most lines allowed."""
    rows = {}
    pattern = re.compile(r"^\| `([^`]+)` \| (module|class|function)(?: `([^`]+)`)? \| (\d+) \|")
    for line in ARCHITECTURE.read_text().splitlines():
        m = pattern.match(line)
        if m:
            rows[(m[1], m[2], m[3] or "")] = int(m[4])
    return rows


def test_no_module_class_or_function_over_its_limit():
    """No module over 400 lines, class over 250, function over 80, in the package, the tools, the
    test kit, the tests and the benchmarks alike, except those docs/architecture.md declares (each
    no longer than it says); a declared exception that no longer exceeds the limit is taken off
    the list."""
    found = {k: v for path in project_files() for k, v in oversize(path).items()}
    declared = declared_exceptions()
    undeclared = [
        f"{f} {kind} {name} has {n} lines (limit {LIMITS[kind]})".replace("  ", " ")
        for (f, kind, name), n in sorted(found.items())
        if n > declared.get((f, kind, name), 0)
    ]
    stale = sorted(k for k in declared if k not in found)
    assert not undeclared, "\n".join(undeclared)
    assert not stale, f"within the limits now, take off docs/architecture.md's list: {stale}"


def test_the_size_check_sees_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    found = oversize(PKG / "core" / "planted.py", f"def f():\n{body}")
    assert found == {("dualtrain/core/planted.py", "function", "f"): 82}


# ---- one name per test file ----------------------------------------------------------------------


def same_named(paths: list[Path]) -> dict[str, list[str]]:
    """Test files that share a name (pytest's rootdir-relative ids tell them apart, a person
    running ``pytest -k`` or reading a log does not)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        if p.name.startswith("test_"):
            by_name[p.name].append(str(p.relative_to(ROOT)))
    return {n: sorted(v) for n, v in by_name.items() if len(v) > 1}


def test_no_two_test_files_share_a_name():
    assert not same_named(project_files("tests", "parity_tests"))


def test_the_name_check_sees_a_twin():
    twins = [ROOT / "tests" / "core" / "test_x.py", ROOT / "parity_tests" / "test_x.py"]
    assert same_named(twins) == {"test_x.py": ["parity_tests/test_x.py", "tests/core/test_x.py"]}
