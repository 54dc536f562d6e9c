"""The Python example stays valid: it compiles and uses names the package still exports. (That
the shell examples parse is tests/integration/test_examples_shell.py; running them is what
tests/integration/test_torch_torchrun.py and tests/integration/test_tf_external.py do for the same
launch paths.)"""

import ast
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_python_example_uses_names_the_package_exports():
    import dualtrain

    tree = ast.parse((EXAMPLES / "python_api.py").read_text())
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "dualtrain"
    }
    assert {"run", "compare"} <= used
    missing = [
        name
        for name in used
        if name not in dualtrain.__all__ or getattr(dualtrain, name, None) is None
    ]
    assert not missing, missing
