"""The report files, the terminal table and the ``dualtrain compare RUN_A RUN_B`` command."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dualtrain.cli import main
from dualtrain.parity import compare_dirs, write_report
from dualtrain.parity.report import table, terminal_summary
from testkit.synth import base_loss, base_spec, fp64_spec, make_run, noisy, quad


@pytest.fixture
def pair(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", backend="tf", loss=lambda s: base_loss(s) + 1e-7)
    return a, b


@pytest.fixture
def bad_pair(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(
        tmp_path / "b",
        backend="tf",
        spec=base_spec(**{"optimizer.lr": 0.1}),
        lr=lambda s: 0.1,
        loss=lambda s: base_loss(s) + (0.05 if s >= 2 else 0.0),
    )
    return a, b


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_report_files(pair, tmp_path):
    a, b = pair
    cmp = compare_dirs(a, b)
    paths = write_report(cmp, tmp_path / "rep")
    v = json.loads(paths["verdict"].read_text())
    assert v["passed"] is True
    assert [c["name"] for c in v["checks"]] == [c.name for c in cmp.checks]
    for c in v["checks"]:
        assert set(c) >= {"name", "value", "tolerance", "passed", "detail"}
    assert v["runs"]["a"]["path"] == str(a) and v["runs"]["b"]["label"] == "tf"
    assert v["versions"]["a"]["torch"] == "synthetic" and "dualtrain" in v["versions"]
    assert v["tolerances"]["precision"] == "fp32"
    md = paths["markdown"].read_text()
    assert "| trajectory |" in md and "PASS" in md


def test_the_report_says_what_was_compared(pair, tmp_path):
    # A report attached to a CI run or a mail stands on its own: the spec's facts and the spec.
    a, b = pair
    paths = write_report(compare_dirs(a, b), tmp_path / "rep")
    x = json.loads(paths["verdict"].read_text())["experiment"]
    assert x["name"] == "synth" and x["world_size"] == 2 and x["precision"] == "fp32"
    assert x["steps"] == 120 and x["batch_size"] == 64
    assert x["model"] == "4 layers: flatten, dense 16, relu, dense 10"
    assert x["optimizer"] == "sgd lr 0.05 momentum 0.9 schedule constant"
    assert x["spec"]["optimizer"]["lr"] == 0.05 and "spec_b" not in x
    md, page = paths["markdown"].read_text(), paths["html"].read_text()
    assert md.startswith("# dualtrain compare: synth: PASS")
    for text in (md, page):
        assert "4 layers: flatten, dense 16, relu, dense 10" in text and "name: synth" in text
    assert "<title>dualtrain compare: synth: PASS</title>" in page


def test_the_header_is_right_for_a_model_pair_on_a_small_dataset(tmp_path):
    # issue 46 item 3: a model pair showed "0 layers:" and 1,438 digits "all (60,000)"
    spec = base_spec(
        **{
            "data.dataset": "digits",
            "model.layers": [],
            "model.torch": "mine_torch:model",
            "model.keras": "mine_keras:model",
            "model.args": {"width": 384},
            "train.max_steps": 30,
        }
    )
    init = {"w": np.ones((4, 3), np.float32)}  # a pair's weights come from its factories
    runs = [
        make_run(tmp_path / n, backend=n, spec=spec, steps=30, init=init) for n in ("torch", "tf")
    ]
    for run in runs:
        facts = {"dataset": "digits", "sizes": {"train": 1438, "test": 359}}
        (run / "data.json").write_text(json.dumps(facts))
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "epochs_run": 0.6667}))
    x = json.loads(write_report(compare_dirs(*runs), tmp_path / "rep")["verdict"].read_text())
    head = x["experiment"]
    assert head["model"] == "model pair: torch mine_torch:model, keras mine_keras:model (width 384)"
    assert head["train_samples"] == "all 1,438 (digits)"
    assert head["epochs"] == "0.667 (max_steps 30 of epochs 1)"


def test_html_is_self_contained(bad_pair, tmp_path):
    a, b = bad_pair
    ra = make_run(tmp_path / "ra", spec=fp64_spec())
    rb = make_run(
        tmp_path / "rb", backend="tf", spec=fp64_spec(**{"optimizer.lr": 0.1}), loss=noisy(1e-15, 3)
    )
    page = write_report(compare_dirs(a, b, (ra, rb)), tmp_path / "rep")["html"].read_text()
    # loss, reference pair, per-step difference, accuracy, loss scale, throughput
    assert page.count("data:image/png;base64,") == 6
    assert "Reference pair (fp64)" in page
    assert "http://" not in page and "https://" not in page
    srcs = re.findall(r"""src\s*=\s*['"]([^'"]*)""", page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"<link|<script|url\(", page)
    assert "different learning rate" in page


def test_terminal_table_is_aligned(bad_pair):
    cmp = compare_dirs(*bad_pair)
    lines = table(cmp).splitlines()
    assert lines[0].split() == ["group", "check", "value", "tolerance", "result"]
    col = lines[0].index("result")
    for line in lines[2:]:
        assert line[col:].strip() in ("PASS", "FAIL", "INFO", "NOT JUDGED"), line
    text = terminal_summary(cmp)
    assert text.splitlines()[-1].startswith("verdict: FAIL")
    assert "first divergent step 1" in text and "likely cause: different learning rate" in text
    assert "FAIL, semantics differ" in text


def test_report_shows_the_reference_pair_and_the_category(tmp_path):
    a, b, ra, rb = quad(
        tmp_path, ref_b_loss=lambda s: noisy(1e-15, 12)(s) + (1e-8 if s >= 5 else 0)
    )
    cmp = compare_dirs(a, b, (ra, rb))
    paths = write_report(cmp, tmp_path / "rep")
    v = json.loads(paths["verdict"].read_text())
    assert v["category"] == "semantics differ" and v["semantics_checked"] is True
    assert (
        v["runs"]["reference_a"]["path"] == str(ra)
        and v["runs"]["reference_b"]["label"] == "tf fp64"
    )
    assert v["reference_bounds"]["loss_abs"] == 1e-10
    md = paths["markdown"].read_text()
    assert "| semantics | reference_loss |" in md and "category: **semantics differ**" in md
    ok = compare_dirs(a, b)
    assert "semantics NOT checked" in terminal_summary(ok)


def test_cli_compare_existing_runs_pass(pair, tmp_path, capsys):
    a, b = pair
    code, out, _ = run_main(["compare", str(a), str(b), "--out", str(tmp_path / "r")], capsys)
    assert code == 0
    assert "verdict: PASS" in out
    for name in ("verdict.json", "report.md", "report.html"):
        assert (tmp_path / "r" / name).is_file()


def test_cli_compare_existing_runs_fail_exit_1(bad_pair, tmp_path, capsys):
    a, b = bad_pair
    code, out, _ = run_main(["compare", str(a), str(b), "--out", str(tmp_path / "r")], capsys)
    assert code == 1
    assert "verdict: FAIL" in out and "different learning rate" in out
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["passed"] is False and v["diagnosis"]["cause"] == "different learning rate"
    assert v["diagnosis"]["first_divergent_step"] == 1


@pytest.mark.parametrize(
    "args, words",
    [
        (["compare"], "exactly two run directories"),
        (["compare", "A"], "Received: 1 run directory"),
        (["compare", "A", "B", "C"], "Received: 3"),
        (["compare", "--config", "x.yaml", "A", "B"], "not both"),
        (["compare", "A", "B", "--set", "seed=1"], "need --config"),
        (
            ["compare", "--config", "configs/mnist_mlp.yaml", "--reference-runs", "T", "U"],
            "--reference-runs",
        ),
        (
            ["compare", "--config", "configs/mnist_mlp.yaml", "--reference", "fp32"],
            "--reference must be",
        ),
        (["compare", "A", "B", "--reference", "none"], "goes with --config"),
        (["compare", "--config", "no/such.yaml"], "config file not found"),
    ],
)
def test_cli_usage_errors_exit_2(args, words, capsys):
    code, _, err = run_main(args, capsys)
    assert code == 2
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_reference_runs_must_be_fp64(pair, tmp_path, capsys):
    a, b = pair
    code, _, err = run_main(["compare", str(a), str(b), "--reference-runs", str(a), str(b)], capsys)
    assert code == 2 and "a reference run must be fp64" in err


def test_cli_missing_run_dir_exit_2(pair, tmp_path, capsys):
    a, _ = pair
    code, _, err = run_main(["compare", str(a), str(tmp_path / "nope")], capsys)
    assert code == 2 and "run directory not found" in err


def test_the_kernels_of_the_precision_path_are_shown_and_a_difference_is_said(tmp_path):
    # a bf16 pair whose tf matmul truncates (its run's calibration): the reports name each
    # backend's kernels, mark the difference, and the terminal says it in one line
    from testkit.synth import set_kernels

    spec = base_spec(precision={"dtype": "bf16"})
    a = make_run(tmp_path / "a", spec=spec)
    b = make_run(tmp_path / "b", backend="tf", spec=spec)
    set_kernels(a, "bf16", {"matmul": 0.0, "conv": 0.0})
    set_kernels(b, "bf16", {"matmul": -0.73, "conv": 0.0})
    cmp = compare_dirs(a, b)
    out = tmp_path / "report"
    write_report(cmp, out)
    v = json.loads((out / "verdict.json").read_text())
    assert v["kernels"]["dtype"] == "bf16" and v["kernels"]["differ"] == ["matmul"]
    md = (out / "report.md").read_text()
    assert "## Kernels of the bf16 path" in md
    assert re.search(
        r"\| tf \| matmul \| .*toward zero \(directed -0\.73 u.* \*\*differs\*\* \|", md
    )
    assert "(differs)" in (out / "report.html").read_text()
    assert "kernels: the backends' bf16 kernels differ: matmul" in terminal_summary(cmp)
    # the same kernels on both sides: the table, no difference, no terminal line
    set_kernels(b, "bf16", {"matmul": 0.0, "conv": 0.0})
    cmp = compare_dirs(a, b)
    assert "kernels differ" not in terminal_summary(cmp)
