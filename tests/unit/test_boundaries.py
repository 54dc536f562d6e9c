"""Only dualtrain/backends/torch imports torch; only dualtrain/backends/tf imports tensorflow/keras
(read from the source; the import itself, in a fresh interpreter, is
tests/integration/test_boundaries.py)."""

import ast
from pathlib import Path

from tests.conftest import ROOT

PKG = ROOT / "dualtrain"
FRAMEWORKS = {"torch": PKG / "backends" / "torch", "tensorflow": PKG / "backends" / "tf",
              "keras": PKG / "backends" / "tf"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
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
