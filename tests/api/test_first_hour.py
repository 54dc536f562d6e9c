"""A new user's mistakes (issue 16), in this process: the Python API raises the cause before
anything starts. (The CLI's one-line errors and the dry runs:
tests/integration/test_first_hour_cli.py.)"""

from __future__ import annotations

import pytest

from testkit.cli import ROOT

CONFIG = str(ROOT / "configs" / "mnist_mlp.yaml")


def test_the_python_api_raises_the_cause(tmp_path):
    import dualtrain
    from dualtrain.errors import UserError

    with pytest.raises(UserError, match="cannot be written"):
        dualtrain.run(CONFIG, "torch", out="/proc/dualtrain-x")
