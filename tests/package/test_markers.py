"""The Makefile's serial commands collect only the folders in SERIAL_TESTS: a test marked serial
anywhere else would be left out of every run, so none is."""

import re

from testkit.cli import ROOT


def test_every_serial_test_lives_where_the_serial_commands_look():
    m = re.search(r"^SERIAL_TESTS = (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m, "the Makefile no longer names SERIAL_TESTS"
    folders = m[1].split()
    marked = sorted(
        str(p.relative_to(ROOT))
        for top in ("tests", "parity_tests")
        for p in (ROOT / top).rglob("*.py")
        if re.search(r"mark\.serial\b", p.read_text())
    )
    assert marked, "no test is marked serial: the pattern above is stale"
    outside = [f for f in marked if not any(f.startswith(d + "/") for d in folders)]
    assert not outside, (
        f"marked serial outside {folders} (add the folder to SERIAL_TESTS): {outside}"
    )
