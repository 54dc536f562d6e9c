"""The compare report's environment table, and the differences it shows (dualtrain.records.envinfo).

Synthetic run directories (testkit/synth.py) whose summary.json carries env facts that differ
in one known fact. ``dualtrain env`` itself and a real run's facts:
tests/integration/test_env_cli.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from dualtrain.parity import compare_dirs, write_report
from dualtrain.parity.report import terminal_summary
from dualtrain.records.envinfo import core_facts, env_differences
from testkit.synth import base_loss, make_run, quad


def set_env(run: Path, env: dict) -> Path:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary["env"] = env
    path.write_text(json.dumps(summary))
    return run


def torch_facts(threads: int = 2) -> dict:
    return {
        "versions": {"torch": "2.13.0+cpu"},
        "devices": {"gpu_count": 0, "gpus": []},
        "settings": {"cpu_capability": "AVX512", "num_threads": threads, "mkldnn_enabled": True},
    }


def tf_facts(onednn: bool = False) -> dict:
    return {
        "versions": {"tensorflow": "2.21.0", "keras": "3.15.1"},
        "devices": {"gpus": []},
        "settings": {"onednn_enabled": onednn, "intra_op_threads": 2},
    }


def test_env_differences_compare_like_with_like():
    core = core_facts({})
    capped = copy.deepcopy(core)
    capped["settings"]["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    envs = {
        "a": {"core": core, "torch": torch_facts()},
        "b": {"core": capped, "tf": tf_facts()},
        "reference_a": {"core": core, "torch": torch_facts(1)},
        "reference_b": None,
    }
    d = env_differences(envs)
    assert d["compared"] == ["a", "b", "reference_a"] and d["missing"] == ["reference_b"]
    assert d["differences"] == [
        {
            "fact": "core.settings.ONEDNN_MAX_CPU_ISA",
            "scope": "core",
            "values": {"a": "(unset)", "b": "AVX2", "reference_a": "(unset)"},
        },
        {
            "fact": "torch.settings.num_threads",
            "scope": "torch",
            "values": {"a": 2, "reference_a": 1},
        },
    ]  # torch facts of a torch run against a tf run are not differences
    same = {"a": {"core": core, "torch": torch_facts()}, "b": {"core": core, "tf": tf_facts(True)}}
    assert env_differences(same)["differences"] == []


def test_report_shows_differing_fact_side_by_side(tmp_path):
    core = core_facts({})
    capped = copy.deepcopy(core)
    capped["settings"]["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    a = set_env(make_run(tmp_path / "a"), {"core": core, "torch": torch_facts()})
    b = set_env(
        make_run(tmp_path / "b", backend="tf", loss=lambda s: base_loss(s) + 1e-7),
        {"core": capped, "tf": tf_facts()},
    )
    cmp = compare_dirs(a, b)
    paths = write_report(cmp, tmp_path / "rep")

    v = json.loads(paths["verdict"].read_text())
    assert v["environment"]["differences"] == [
        {
            "fact": "core.settings.ONEDNN_MAX_CPU_ISA",
            "scope": "core",
            "values": {"a": "(unset)", "b": "AVX2"},
        }
    ]
    md = paths["markdown"].read_text()
    assert "## Environment" in md
    assert "| fact | a: torch | b: tf |" in md
    assert "| `core.settings.ONEDNN_MAX_CPU_ISA` | (unset) | AVX2 |" in md
    html = paths["html"].read_text()
    assert (
        "<tr><td><code>core.settings.ONEDNN_MAX_CPU_ISA</code></td><td>(unset)</td>"
        "<td>AVX2</td></tr>"
    ) in html
    assert "<th>a: torch</th><th>b: tf</th>" in html
    assert "environment differs in 1 fact: core.settings.ONEDNN_MAX_CPU_ISA" in terminal_summary(
        cmp
    )


def test_report_identical_envs_show_no_table(tmp_path):
    env = {"core": core_facts({"OMP_NUM_THREADS": "2"})}
    a = set_env(make_run(tmp_path / "a"), {**env, "torch": torch_facts()})
    b = set_env(make_run(tmp_path / "b", backend="tf"), {**env, "tf": tf_facts()})
    paths = write_report(compare_dirs(a, b), tmp_path / "rep")
    v = json.loads(paths["verdict"].read_text())
    assert v["environment"] == {"compared": ["a", "b"], "missing": [], "differences": []}
    md = paths["markdown"].read_text()
    assert "Environments match (2 runs)." in md and "| fact |" not in md
    html = paths["html"].read_text()
    assert "<p>Environments match (2 runs).</p>" in html and "<th>fact</th>" not in html


def test_report_reference_runs_compare_backend_facts(tmp_path):
    """With the fp64 reference pair, a torch fact is compared between the two torch runs (a and
    reference_a) and a tf fact between the two tf runs; the other columns stay empty."""
    a, b, ra, rb = quad(tmp_path)
    core = {"core": core_facts({})}
    set_env(a, {**core, "torch": torch_facts(2)})
    set_env(ra, {**core, "torch": torch_facts(1)})
    set_env(b, {**core, "tf": tf_facts(True)})
    set_env(rb, {**core, "tf": tf_facts(False)})
    paths = write_report(compare_dirs(a, b, (ra, rb)), tmp_path / "rep")
    v = json.loads(paths["verdict"].read_text())
    facts = {d["fact"]: d["values"] for d in v["environment"]["differences"]}
    assert facts == {
        "torch.settings.num_threads": {"a": 2, "reference_a": 1},
        "tf.settings.onednn_enabled": {"b": True, "reference_b": False},
    }
    md = paths["markdown"].read_text()
    assert ("| fact | a: torch | b: tf | reference_a: torch fp64 | reference_b: tf fp64 |") in md
    assert "| `torch.settings.num_threads` | 2 |  | 1 |  |" in md
    assert "| `tf.settings.onednn_enabled` |  | yes |  | no |" in md


def test_report_runs_without_env_say_so(tmp_path):
    a = make_run(tmp_path / "a")
    b = set_env(make_run(tmp_path / "b", backend="tf"), {"core": core_facts({})})
    paths = write_report(compare_dirs(a, b), tmp_path / "rep")
    md = paths["markdown"].read_text()
    assert "Not recorded in a" in md and "| fact |" not in md
