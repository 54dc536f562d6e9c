"""The CLI and the framework-free core import in a fresh interpreter where torch, tensorflow and
keras cannot be imported. (Which files import a framework, read from the source:
tests/package/test_boundaries.py.)"""

import subprocess
import sys

from testkit.cli import ROOT


def test_cli_and_core_import_without_frameworks():
    # Poison the framework modules: importing any of them raises ImportError.
    code = (
        "import sys\n"
        "for m in ('torch', 'tensorflow', 'keras'): sys.modules[m] = None\n"
        "import dualtrain.cli, dualtrain.spec, dualtrain.core.plan, dualtrain.core.data, "
        "dualtrain.core.weights\n"
        "import dualtrain.driver.runs, dualtrain.runtime.loop, dualtrain.records.record, "
        "dualtrain.launch.local\n"
        "import dualtrain.backends.torch.launch\n"
        "import importlib.util\n"
        "import dualtrain.parity, dualtrain.driver.compare\n"
        "if importlib.util.find_spec('dualtrain.backends.tf.launch'): "
        "import dualtrain.backends.tf.launch\n"
        "from dualtrain.cli import cli\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
