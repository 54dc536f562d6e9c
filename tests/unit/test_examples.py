"""The examples stay valid: shell scripts parse, the Python example compiles and uses names the
package still exports. (Running them is what tests/torch/test_torch_torchrun.py and
tests/tf/test_tf_external.py do for the same launch paths.)"""

import ast
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.sh")))
def test_shell_example_parses(script):
    proc = subprocess.run(["bash", "-n", str(EXAMPLES / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_python_example_imports_exist():
    tree = ast.parse((EXAMPLES / "python_api.py").read_text())
    imports = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names]
    assert imports
    for module, name in imports:
        mod = __import__(module, fromlist=[name])
        assert hasattr(mod, name), f"{module}.{name}"
