"""The tutorials' quoted outputs are checked against what their commands print, numbers aside
(tools/tutorials.py; the runs themselves: tests/integration/test_docs_tutorials.py). Here, on
text: every tutorial has steps and quotes, a changed verdict line is missing, a moved number is
not."""

from __future__ import annotations

import pytest

from tools.prose import ROOT
from tools.tutorials import missing, steps

PRINTED = """\
numerics   convergence        0.15 pp below fp64  <= 1       PASS
verdict: PASS (16/16 checks; semantics checked against the fp64 reference pair)
"""


@pytest.mark.parametrize("page", ["tutorial-compare.md", "tutorial-port.md", "tutorial-scripts.md"])
def test_every_tutorial_has_steps_and_quotes(page):
    found = steps(ROOT / "docs" / page)
    assert len(found) >= 2 and all(s.commands for s in found)
    assert sum(len(s.quoted) for s in found) >= 3


def test_a_changed_verdict_line_is_missing():
    quoted = ["verdict: FAIL (16/16 checks; semantics checked against the fp64 reference pair)"]
    assert missing(quoted, PRINTED) == quoted


def test_numbers_that_move_between_machines_are_not():
    quoted = ["numerics   convergence        0.31 pp below fp64  <= 1       PASS"]
    assert missing(quoted, PRINTED) == []
