"""Only dualtrain/backends/torch imports torch; only dualtrain/backends/tf imports tensorflow/keras
(read from the source; the import itself, in a fresh interpreter, is
tests/integration/test_boundaries_import.py)."""

import ast
import re
from pathlib import Path

from testkit.cli import ROOT

PKG = ROOT / "dualtrain"
FRAMEWORKS = {
    "torch": PKG / "backends" / "torch",
    "tensorflow": PKG / "backends" / "tf",
    "keras": PKG / "backends" / "tf",
}


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


def test_framework_imports_stay_in_their_backend():
    offenders = []
    for path in PKG.rglob("*.py"):
        roots = imported_roots(path)
        for fw, home in FRAMEWORKS.items():
            if fw in roots and home not in path.parents:
                offenders.append(f"{path.relative_to(ROOT)} imports {fw}")
    assert not offenders, offenders


def test_backend_launch_modules_are_framework_free():
    for backend in ("torch", "tf"):
        path = PKG / "backends" / backend / "launch.py"
        if path.exists():
            assert not imported_roots(path) & set(FRAMEWORKS), path


# ---- layers: the package is the pipeline, each folder imports only from the ones before it -------

LAYERS = [
    {"errors", "version", "jsonio"},  # plain helpers every layer may use
    {"spec"},  # the Experiment schema
    {"records"},  # the files a run leaves
    {"core"},  # what both backends compute, defined once
    {"runtime"},  # one worker's training loop, the engine contract, checkpoints
    {"launch"},  # starting and watching workers, cluster conventions
    {"audit"},  # recorded runs of users' own scripts: format, sample identity, checks
    {"backends"},  # torch and tf: engines, models, their launch modules
    {"parity"},  # checks, diagnosis and report on finished runs
    {"driver"},  # run / compare / export in the launcher process
    {"api", "__init__"},  # the Python API (the package root re-exports it lazily)
    {"cli", "__main__"},
]


def layer_of(module: str) -> int:
    """Layer index of a dualtrain module name (``dualtrain.core.plan`` -> 3)."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if head in names:
            return i
    raise AssertionError(f"{module} belongs to no layer: add its folder to LAYERS")


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
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "dualtrain":
                found.add(mod)
                # `from dualtrain.core import plan` names the module dualtrain.core.plan
                found |= {f"{mod}.{a.name}" for a in node.names if is_module(f"{mod}.{a.name}")}
    return found - {me}


def is_module(name: str) -> bool:
    path = PKG.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def upward_imports(module: str, imports: set[str]) -> list[str]:
    return [
        f"{module} imports {other}"
        for other in sorted(imports)
        if layer_of(other) > layer_of(module)
    ]


def package_imports() -> dict[str, set[str]]:
    return {module_name(p): dualtrain_imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_no_layer_imports_a_higher_one():
    upward = [
        line for me, imports in package_imports().items() for line in upward_imports(me, imports)
    ]
    assert not upward, "\n".join(upward)


def test_the_layer_check_sees_an_upward_import():
    """The check itself: a core module that imports the driver, even inside a function, is named."""
    source = "def f():\n    from dualtrain.driver import runs\n"
    imports = dualtrain_imports(PKG / "core" / "planted.py", source, "dualtrain.core.planted")
    assert upward_imports("dualtrain.core.planted", imports) == [
        "dualtrain.core.planted imports dualtrain.driver",
        "dualtrain.core.planted imports dualtrain.driver.runs",
    ]


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


def test_no_import_cycle():
    """A package's __init__ importing its own modules is not a cycle (edges into a package's
    __init__ from inside it are left out); any other circle of imports is."""
    graph = {
        me: {o for o in imports if not me.startswith(o + ".")}
        for me, imports in package_imports().items()
    }
    assert not cycles(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_the_two_backends_do_not_import_each_other():
    for mine, theirs in (("torch", "tf"), ("tf", "torch")):
        for path in (PKG / "backends" / mine).rglob("*.py"):
            bad = [
                m for m in dualtrain_imports(path) if m.startswith(f"dualtrain.backends.{theirs}")
            ]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


#: Files only one backend has, and why. The gradient's absolute scale (the local checks' yardstick)
#: is measured on the fp64 reference run of one backend, torch's (backends/torch/condition.py).
#: Keras layers for porting a torch model (backends/tf/port.py: TorchBatchNormalization) exist on
#: the Keras side only: torch's layers are the reference a port follows.
#: Keras's float64 ops that are float32-accurate, run exactly (backends/tf/exact.py, core.limits):
#: torch's float64 ops are exact, so the torch side has nothing to substitute.
ONE_SIDED = {"torch": {"condition.py"}, "tf": {"port.py", "exact.py"}}


def test_both_backends_have_the_same_files():
    """Each backend package has the same modules, each with the same job (the docstrings say
    which): launch, worker, engine, model, ops, optimizer, precision, export, tools, envinfo."""
    files = {
        b: {p.name for p in (PKG / "backends" / b).glob("*.py")} - ONE_SIDED[b]
        for b in ("torch", "tf")
    }
    assert files["torch"] == files["tf"], files["torch"] ^ files["tf"]


# ---- an honest graph: no private name crosses a module, no cycle anywhere (tools included) -------

TOOLS = ROOT / "tools"


def project_files() -> list[Path]:
    return sorted([*PKG.rglob("*.py"), *TOOLS.rglob("*.py")])


def private_crossings(path: Path, source: str | None = None) -> list[str]:
    """Each single-underscore name ``path`` takes from another dualtrain or tools module: imported
    by name, or read as an attribute of a module it imported."""
    tree = ast.parse(path.read_text() if source is None else source)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] not in ("dualtrain", "tools") or mod == me:
                continue
            for a in node.names:
                if (
                    is_module(f"{mod}.{a.name}")
                    or (TOOLS.parent / f"{mod}.{a.name}".replace(".", "/"))
                    .with_suffix(".py")
                    .exists()
                ):
                    modules[a.asname or a.name] = f"{mod}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{me} imports {a.name} from {mod}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("dualtrain", "tools") and a.asname:
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
    """A name another module needs is public (or moves to where it is used)."""
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
    found = [line for path in project_files() for line in unmarked_function_imports(path)]
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
    """No module over 400 lines, class over 250, function over 80, except those docs/architecture.md
    declares (each no longer than it says); a declared exception that no longer exceeds the limit
    is taken off the list."""
    found = {k: v for path in sorted(PKG.rglob("*.py")) for k, v in oversize(path).items()}
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
