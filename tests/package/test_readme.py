"""The measured numbers that come from the code's own lists (docs/measurements.md, where the
README's tables moved): the mutants the detection-power claims were measured with (tools/mutants/).
The check count the README quotes is asserted against a real compare's verdict in
tests/integration/test_compare_config.py."""

import re

from testkit.cli import ROOT
from tools import mutants

README = (ROOT / "docs" / "measurements.md").read_text()


def test_mutant_counts_are_the_code_lists():
    m = re.search(r"measured with (\d+) semantic mutants and (\d+) precision-path mutants", README)
    assert m, "docs/measurements.md no longer states its mutant counts"
    assert (int(m[1]), int(m[2])) == (len(mutants.MUTANTS), len(mutants.PRECISION_MUTANTS))


def test_precision_detection_row_is_the_code_list():
    # "a defect in one backend's ... path only (5 kinds, each on torch and on tf) ... all 10 FAIL"
    m = re.search(r"\((\d+) kinds, each on torch and on tf\).*?all (\d+) FAIL", README)
    assert m, "docs/measurements.md's detection-power row moved"
    kinds = len(mutants.PRECISION_MUTANTS)
    assert (int(m[1]), int(m[2])) == (kinds, 2 * kinds)
