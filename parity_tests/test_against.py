"""A framework upgrade is its own kind of finding (issue 46 item 2): ``dualtrain compare --against``
a saved passing compare runs its spec again with today's frameworks and holds each backend's runs
to the saved ones. With nothing changed it passes and says so; with one op of Keras changed and
Keras's version bumped (a simulated release, planted through the worker hook) the verdict names the
backend, the two versions and the operation, and the other backend is unchanged."""

import json

import pytest

from testkit.browser import chromium, look
from testkit.cli import run_cli
from testkit.parity_runs import MLP
from tools.mutants import SPECS, UPGRADES, hook


def _compare(*args, env=None):
    return run_cli("compare", *args, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UPGRADES))
def test_compare_against_a_saved_compare_names_the_upgrade_and_its_op(tmp_path, name):
    u = UPGRADES[name]
    sets = [a for o in SPECS[u.spec] if "precision" not in o for a in ("--set", o)]
    saved = tmp_path / "saved"
    res = _compare("--config", MLP, "--precision", "fp64", *sets, "--out", str(saved))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]

    same = tmp_path / "same"
    res = _compare("--against", str(saved), "--out", str(same))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    held = json.loads((same / "against.json").read_text())
    assert held["lead"].startswith("no change since the saved compare"), held["lead"]
    assert not any(r["changed"] for r in held["runs"])

    today = tmp_path / "today"
    res = _compare("--against", str(saved), "--out", str(today), env=hook(name, backend=u.backend))
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    line = json.loads((today / "verdict.json").read_text())["verdict"]
    print(f"{name}: {line}")
    assert f"{u.backend} changed between {u.versions}" in line, line
    for w in u.words:
        assert w in line, line
    held = json.loads((today / "against.json").read_text())
    changed = {r["label"]: r["changed"] for r in held["runs"]}
    other = "torch" if u.backend == "tf" else "tf"
    assert changed[u.backend] and not changed[other], held
    if chromium() is not None:  # the report's against table, as a person sees it
        seen = look(today / "report.html")
        assert "Against the saved compare" in seen.headings
        assert not seen.wide_tables and not seen.overflowing_cells, seen


def test_against_refuses_what_is_not_a_saved_compare(tmp_path):
    res = _compare("--against", str(tmp_path), "--out", str(tmp_path / "new"))
    assert res.returncode == 2
    assert "--against takes the folder of a finished `dualtrain compare --config`" in res.stderr
    assert "Traceback" not in res.stderr
    res = _compare("--against", str(tmp_path), "--config", MLP)
    assert res.returncode == 2 and "give only --out and --overwrite" in res.stderr
