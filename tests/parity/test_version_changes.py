"""Framework versions between runs of one backend (dualtrain.parity.against): a saved compare and
today's held run by run, and two finished runs of one backend compared, on synthetic run folders.
A run that moved is a change only beyond the fp64 bound, and its versions say between which
releases; a change with the same versions says so."""

import json

from dualtrain.parity.against import against, between
from dualtrain.parity.report import compare_dirs
from testkit.synth import base_loss, make_run


def _bump(run, framework, version):
    p = run / "summary.json"
    summary = json.loads(p.read_text())
    summary["versions"][framework] = version
    p.write_text(json.dumps(summary))


def _compare_out(root, tf_loss=base_loss, tf_noise=0.0):
    root.mkdir()
    make_run(root / "torch", backend="torch")
    make_run(root / "tf", backend="tf", loss=tf_loss, final_noise=tf_noise)
    return root


def test_nothing_changed_is_said_and_nothing_is_a_change(tmp_path):
    saved, today = _compare_out(tmp_path / "saved"), _compare_out(tmp_path / "today")
    found = against(saved, today)
    assert found.lead.startswith("no change since the saved compare")
    assert not found.changed()


def test_a_backend_that_moved_with_new_versions_is_named_with_both(tmp_path):
    saved = _compare_out(tmp_path / "saved")
    today = _compare_out(
        tmp_path / "today", tf_loss=lambda s: base_loss(s) + (1e-6 if s >= 3 else 0)
    )
    _bump(today / "tf", "keras", "3.16.0")
    found = against(saved, today)
    assert [r.label for r in found.changed()] == ["tf"]
    assert found.lead == (
        "tf changed between keras ? and 3.16.0 (its fp64 run parts from the saved one from step 3)"
    )


def test_a_move_below_the_bound_is_no_change_and_one_above_it_with_the_same_versions_says_so(
    tmp_path,
):
    saved = _compare_out(tmp_path / "saved")
    small = _compare_out(tmp_path / "small", tf_loss=lambda s: base_loss(s) + 1e-12)
    assert not against(saved, small).changed()
    moved = _compare_out(tmp_path / "moved", tf_noise=1e-6)
    found = against(saved, moved)
    assert "tf changed with the same framework versions" in found.lead
    assert "in its final weights" in found.lead


def test_two_runs_of_one_backend_with_other_versions_lead_with_the_upgrade(tmp_path):
    a = make_run(tmp_path / "a", backend="torch")
    b = make_run(tmp_path / "b", backend="torch", loss=lambda s: base_loss(s) * 1.5)
    _bump(b, "torch", "2.14.0")
    cmp = compare_dirs(a, b)
    assert not cmp.passed
    assert cmp.diagnosis.finding.startswith("torch changed between torch synthetic and 2.14.0: ")
    assert "the runs' versions differ: torch changed between" in " ".join(cmp.notes)


def test_several_versions_read_as_two_sets():
    changes = ["keras 3.15.1 -> 3.16.0", "tensorflow 2.21.0 -> 2.22.0"]
    assert (
        between(changes) == "keras 3.15.1 / tensorflow 2.21.0 and keras 3.16.0 / tensorflow 2.22.0"
    )
