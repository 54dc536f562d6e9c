"""The torch recorder in this process (world 1, no DDP): what it records, and its one-line errors
for a recorder used wrongly."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
import torch

import dualtrain
import dualtrain.audit as audit
from dualtrain.audit.compare import compare_recorded
from dualtrain.audit.identity import row_digests
from dualtrain.audit.read import read_recorded
from dualtrain.errors import UserError
from testkit.cli import one_line_error


def _train(out, *, steps=6, lr=0.1, scaler=None, loss_fn=None, seed=0, bias_lr=None):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    groups = (
        model.parameters()
        if bias_lr is None  # one group; else the bias in a group of its own
        else [{"params": [model[1].weight]}, {"params": [model[1].bias], "lr": bias_lr}]
    )
    opt = torch.optim.SGD(groups, lr=lr)
    data = torch.utils.data.TensorDataset(torch.rand(24, 1, 4, 4), torch.randint(0, 4, (24,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with audit.torch_recorder(out, model=model, optimizer=opt, loader=loader, scaler=scaler) as rec:
        for i, (x, y) in enumerate(loader):
            if i == steps:
                break
            rec.batch(x)
            opt.zero_grad()
            loss = (loss_fn or torch.nn.functional.cross_entropy)(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            rec.step(loss)
    return data


def test_recording_the_same_loop_twice_passes(tmp_path):
    data = _train(tmp_path / "a")
    _train(tmp_path / "b")
    run = read_recorded(tmp_path / "a")
    assert [s.step for s in run.steps] == [1, 2, 3, 4, 5, 6]
    assert list(run.replicas[(1, 0)].indices) == [0, 1, 2, 3]  # the SequentialSampler's
    exact, pattern = row_digests(data.tensors[0][:4].numpy())  # torch's digests are NumPy's
    assert (
        list(run.replicas[(1, 0)].exact) == exact and list(run.replicas[(1, 0)].pattern) == pattern
    )
    assert all(s.grad_norm > 0 and s.skipped is False for s in run.steps)
    assert set(run.weights_init) == {"1.weight", "1.bias"}
    assert run.config.random_layers == ()  # no dropout: step 1's losses are comparable
    assert run.config.unread() == set()  # every section written is one the diagnoses read
    cmp = dualtrain.compare(tmp_path / "a", tmp_path / "b", out=tmp_path / "cmp", quiet=True)
    assert cmp.passed, [c.detail for c in cmp.checks]
    assert cmp.findings == ()
    verdict = json.loads((tmp_path / "cmp" / "verdict.json").read_text())
    assert verdict["passed"] and verdict["verdict"].startswith("verdict: PASS")
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert "<h2>Checks</h2>" in page and "<td class='PASS'>PASS</td>" in page and "<pre" not in page
    assert page.count("data:image/png;base64,") == 2  # the loss and lr curves (no loss scaling)


def test_report_html_names_a_difference_with_its_line(tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b", lr=0.2)
    cmp = dualtrain.compare(tmp_path / "a", tmp_path / "b", out=tmp_path / "cmp", quiet=True)
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert not cmp.passed and "v-fail" in page and "<td class='FAIL'>FAIL</td>" in page
    for f in cmp.findings:  # each difference, its evidence and the line to change
        assert f"<h3>{html.escape(f.name)}" in page
        assert all(f"<code>{html.escape(x)}</code>" in page for x in f.fixes)
    assert "different base learning rate" in {f.name for f in cmp.findings}


def test_two_records_compare_beside_them_and_a_missing_one_is_said_missing(tmp_path, monkeypatch):
    """Without --out the report went into the current folder's runs/ (issue 48); a record folder
    that does not exist was 'not an audit record' (now what a missing run directory is told)."""
    _train(tmp_path / "recs" / "a")
    _train(tmp_path / "recs" / "b")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cmp = dualtrain.compare(tmp_path / "recs" / "a", tmp_path / "recs" / "b", quiet=True)
    assert cmp.passed and list(elsewhere.iterdir()) == []
    (out,) = (tmp_path / "recs").glob("compare-a-b-*")
    assert (out / "verdict.json").is_file() and cmp.out.resolve() == out.resolve()
    with pytest.raises(UserError, match=r"run directory not found: '.*recs/gone'"):
        dualtrain.compare(tmp_path / "recs" / "a", tmp_path / "recs" / "gone", quiet=True)
    with pytest.raises(UserError, match=r"audit record not found: .*recs/gone does not exist"):
        compare_recorded(tmp_path / "recs" / "a", tmp_path / "recs" / "gone")


def test_a_gradscaler_skip_is_recorded(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)

    def overflow_once(out, y, calls=[]):  # noqa: B006 (a counter across calls)
        calls.append(1)
        loss = torch.nn.functional.cross_entropy(out, y)
        return loss * float("inf") if len(calls) == 2 else loss

    _train(tmp_path / "a", steps=4, scaler=scaler, loss_fn=overflow_once)
    steps = read_recorded(tmp_path / "a").steps
    assert [s.skipped for s in steps] == [False, True, False, False]
    assert [s.loss_scale for s in steps] == [2.0**16, 2.0**16, 2.0**15, 2.0**15]
    assert np.isnan(float(steps[1].grad_norm or 0.0))


def test_a_different_lr_is_named_with_the_line(tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b", lr=0.05)
    cmp = compare_recorded(tmp_path / "a", tmp_path / "b")
    assert not cmp.passed
    assert {c.name: c.status for c in cmp.checks}["learning rate"] == "FAIL"
    assert "different optimizer settings" not in [f.name for f in cmp.findings]  # lr is its own
    assert "different base learning rate" in [f.name for f in cmp.findings]


def test_every_parameter_groups_lr_is_judged(tmp_path):
    # a script with two parameter groups (the bias at its own lr) against the same script, and
    # against one whose optimizer has a single group: the first group's lr alone would PASS them all
    _train(tmp_path / "two", bias_lr=0.1)
    _train(tmp_path / "one")
    _train(tmp_path / "slow_bias", bias_lr=0.02)

    def lr_check(a, b):
        cmp = compare_recorded(tmp_path / a, tmp_path / b)
        return next(c for c in cmp.checks if c.name == "learning rate")

    assert lr_check("two", "one").status == "PASS"  # the same lr for every parameter
    check = lr_check("two", "slow_bias")
    assert check.status == "FAIL" and check.first_step == 1
    assert check.detail == "step 1: parameter group 1: lr 0.1 in A, 0.02 in B"
    check = lr_check("one", "slow_bias")  # one lr for all against each of the other's groups
    assert check.status == "FAIL" and "parameter group 1" in check.detail


def test_two_recorders_in_one_process_are_refused(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt)
    with pytest.raises(UserError, match="one audit recorder per process"):
        audit.torch_recorder(tmp_path / "b", model=model, optimizer=opt)
    rec.close()
    audit.torch_recorder(tmp_path / "b", model=model, optimizer=opt).close()  # free again


def test_a_folder_that_is_not_its_own_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UserError, match="is not an audit record .* and not empty"):
        audit.torch_recorder(tmp_path, model=model, optimizer=opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written
    audit.torch_recorder(tmp_path / "new", model=model, optimizer=opt).close()  # not left claimed


def test_a_distributed_sampler_without_a_process_group_is_refused(tmp_path):
    data = torch.utils.data.TensorDataset(torch.rand(8, 2))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UserError, match="no process group is initialised"):
        audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, sampler=sampler)


def test_misuse_is_one_line_and_a_failed_script_leaves_no_record(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UserError, match=r"needs rec.batch\(inputs\) first"):
        with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
            rec.step(torch.tensor(1.0))
    with pytest.raises(UserError, match="half-written audit record"):
        read_recorded(tmp_path / "a")
    with pytest.raises(UserError, match="optimizer must be a torch.optim.Optimizer"):
        audit.torch_recorder(tmp_path / "b", model=model, optimizer="sgd")


def test_the_cli_compares_two_records_and_refuses_a_mixed_pair(cli, tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b", lr=0.05)
    proc = cli("compare", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(tmp_path / "s"))
    assert proc.returncode == 0 and "verdict: PASS (8/8" in proc.stdout, proc.stderr[-2000:]
    proc = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d"))
    assert proc.returncode == 1 and "different base learning rate" in proc.stdout
    assert (tmp_path / "d" / "report.md").is_file()
    (tmp_path / "run").mkdir()
    line = one_line_error(cli("compare", str(tmp_path / "a"), str(tmp_path / "run")))
    assert "not one of each" in line


def test_micro_batches_of_one_step_add_up_and_the_epoch_can_be_given(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(16, 4)
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
        for epoch in (1, 2):
            for half in (x[:8], x[8:]):
                opt.zero_grad()
                for micro in (half[:4], half[4:]):  # accumulate two micro-batches
                    rec.batch(micro, epoch=epoch)
                    (model(micro).pow(2).mean() / 2).backward()
                opt.step()
                rec.step(0.5)
    run = read_recorded(tmp_path / "a")
    assert [(s.step, s.epoch, s.samples) for s in run.steps] == [
        (1, 1, 8),
        (2, 1, 8),
        (3, 2, 8),
        (4, 2, 8),
    ]
    assert list(run.replicas[(1, 0)].exact) == row_digests(x[:8].numpy())[0]
    assert not any(s.skipped for s in run.steps)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_digests_are_numpys_and_a_gradscaler_skip_is_recorded(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    xs = torch.rand(4, 8, 1, 4, 4)
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, scaler=scaler) as rec:
        for i, x in enumerate(xs):
            x = x.cuda()
            rec.batch(x)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
            rec.step(loss)
    run = read_recorded(tmp_path / "a")
    assert list(run.replicas[(1, 0)].exact) == row_digests(xs[0].numpy())[0]
    assert list(run.replicas[(1, 0)].pattern) == row_digests(xs[0].numpy())[1]
    assert [s.skipped for s in run.steps] == [False, True, False, False]
    assert [s.loss_scale for s in run.steps] == [2.0**16, 2.0**16, 2.0**15, 2.0**15]


def test_the_python_api_compares_two_records_as_the_cli_does(cli, tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b", lr=0.05)
    res = dualtrain.compare(tmp_path / "a", tmp_path / "b", out=tmp_path / "api", quiet=True)
    proc = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c"))
    assert proc.returncode == 1 and not res.passed
    assert res.verdict in proc.stdout and res.verdict.startswith("verdict: FAIL")
    assert "different base learning rate" in [f.name for f in res.findings]
    assert res.diagnosis is None and res.check("learning rate").status == "FAIL"
    files = [json.loads((tmp_path / d / "verdict.json").read_text()) for d in ("api", "c")]
    assert files[0] == files[1] and files[0]["kind"] == "audit"  # one report, whichever door
    lr = next(c for c in files[0]["checks"] if c["name"] == "learning rate")
    assert lr["status"] == "FAIL" and lr["group"] == "recorded runs"
    with pytest.raises(UserError, match="not one of each"):
        dualtrain.compare(tmp_path / "a", tmp_path / "c")  # a record against a report folder
