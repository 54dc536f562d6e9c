"""The HTML report as a person sees it (issue 46 item 3): opened in headless Chromium
(testkit.browser), for a spec model whose compare replayed its first divergent step, a model pair
and two audit records, it renders with its title and sections, every figure loads, and no table is
wider than the page nor any cell's content wider than its cell. The overflow check is shown to
catch an overflowing cell."""

import json

import numpy as np
import pytest

import dualtrain
import dualtrain.audit as audit
from dualtrain.parity.report import compare_dirs, write_report
from dualtrain.parity.report.where import FIGURE
from testkit.browser import chromium, look
from testkit.synth import base_spec, make_run
from tools.mutants import compare_fp64

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium() is None, reason="headless Chromium is not installed (apt-get install chromium)"
    ),
]


def _reads_well(report):
    seen = look(report)
    assert seen.images and all(i["loaded"] and i["width"] > 0 for i in seen.images), seen.images
    assert not seen.wide_tables, seen.wide_tables
    assert not seen.overflowing_cells, seen.overflowing_cells
    return seen


def test_a_spec_models_report_shows_the_first_divergent_step_layer_by_layer(tmp_path):
    out = tmp_path / "cmp"
    res = compare_fp64(out, "dropout", "dropout_by_position")
    assert res.returncode == 1, res.stderr[-2000:]
    seen = _reads_well(out / "report.html")
    assert seen.title.endswith("FAIL")
    assert "First divergent operation (step 1, layer)" in seen.headings
    assert FIGURE in [i["alt"] for i in seen.images]
    where = json.loads((out / "verdict.json").read_text())["first_divergent_operation"]
    assert where["layer"] == "3" and [r["layer"] for r in where["layers"]][3] == "3"


def test_a_model_pairs_report_reads_well(tmp_path):
    spec = base_spec(
        **{
            "data.dataset": "digits",
            "model.layers": [],
            "model.torch": "mine_torch:model",
            "model.keras": "mine_keras:model",
            "model.args": {"width": 384},
        }
    )
    init = {"w": np.ones((4, 3), np.float32)}
    runs = [make_run(tmp_path / n, backend=n, spec=spec, init=init) for n in ("torch", "tf")]
    paths = write_report(compare_dirs(*runs), tmp_path / "rep")
    seen = _reads_well(paths["html"])
    assert seen.title.endswith("PASS")


def _recorded(out, lr):
    import torch  # lazy: framework (this test module runs without it otherwise)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.utils.data.TensorDataset(torch.rand(24, 1, 4, 4), torch.randint(0, 4, (24,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with audit.torch_recorder(out, model=model, optimizer=opt, loader=loader) as rec:
        for x, y in loader:
            rec.batch(x)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            rec.step(loss)


def test_two_audit_records_report_reads_well(tmp_path):
    _recorded(tmp_path / "a", 0.1)
    _recorded(tmp_path / "b", 0.2)
    cmp = dualtrain.compare(tmp_path / "a", tmp_path / "b", out=tmp_path / "cmp", quiet=True)
    assert not cmp.passed
    seen = _reads_well(tmp_path / "cmp" / "report.html")
    assert seen.title.endswith("FAIL")


def test_the_check_sees_a_cell_that_overflows(tmp_path):
    page = tmp_path / "wide.html"
    word = "x" * 400
    page.write_text(
        "<!DOCTYPE html><html><body><table style='table-layout: fixed; width: 200px'>"
        f"<tr><td style='overflow: hidden'>{word}</td></tr></table></body></html>"
    )
    seen = look(page)
    assert seen.overflowing_cells and seen.overflowing_cells[0]["text"].startswith("xxx")
