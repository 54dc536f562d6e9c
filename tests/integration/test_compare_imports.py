"""The compare package, the report and the compare command import no framework: a fresh
interpreter where torch, tensorflow and keras cannot be imported loads them. (The report itself, in
process: tests/parity/test_report.py.)"""

from __future__ import annotations

import subprocess
import sys

from testkit.cli import ROOT


def test_compare_package_imports_no_framework():
    code = (
        "import sys\n"
        "for m in ('torch', 'tensorflow', 'keras'): sys.modules[m] = None\n"
        "import dualtrain.parity, dualtrain.driver.compare, dualtrain.parity.report\n"
        "import dualtrain.cli.compare\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
