"""The shell examples stay valid: each parses (``bash -n``, a process). The Python example is
tests/api/test_examples.py; running them is what tests/integration/test_torch_torchrun.py and
tests/integration/test_tf_external.py do for the same launch paths."""

import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


SCRIPTS = sorted(
    str(p.relative_to(EXAMPLES)) for p in [*EXAMPLES.glob("*.sh"), *EXAMPLES.glob("slurm/*.sbatch")]
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_shell_example_parses(script):
    proc = subprocess.run(["bash", "-n", str(EXAMPLES / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
