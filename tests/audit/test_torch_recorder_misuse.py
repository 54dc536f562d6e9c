"""The torch recorder misused, or failing: a loss that is not one number, calls out of order, a
recorder that cannot start, DDP with a folder the chief refuses, replicas that train apart, a
recorder in some processes only, a script that dies with its recorder open."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

import dualtrain.audit as audit
from dualtrain.audit.read import read_recorded
from dualtrain.audit.replicas import check_replicas, replicas_apart
from dualtrain.errors import UserError
from testkit.tf_runs import Backend, run_python
from tests.audit import torch_loops as loops


def test_rec_step_refuses_a_loss_that_is_not_one_number(tmp_path):
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
        rec.batch(torch.rand(4, 16))
        for bad, shown in ((torch.rand(4), "a Tensor (float32, shape (4,))"), (None, "None")):
            with pytest.raises(UserError) as e:
                rec.step(bad)
            assert "rec.step takes the step's loss, a number or a one-element tensor" in str(
                e.value
            )
            assert str(e.value).endswith(f"Received: {shown}") and "\n" not in str(e.value)
        rec.step(torch.tensor([0.5]))


def test_calls_out_of_order_are_one_line_errors_and_rec_step_may_precede_the_step(tmp_path):
    """rec.batch after the optimizer step, rec.step forgotten, two optimizer steps in one
    recorded step: each refused in one line (before, each silently moved every step's gradient
    norm to its neighbour or merged steps); rec.step before optimizer.step records as after."""
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))

    def late(rec, m, o):  # rec.batch after the optimizer step
        loops.step(m, o, x, y)
        rec.batch(x)

    def forgotten(rec, m, o):  # no rec.step
        for _ in range(2):
            rec.batch(x)
            loops.step(m, o, x, y)

    def twice(rec, m, o):  # two optimizer steps, one rec.batch
        rec.batch(x)
        loops.step(m, o, x, y)
        loops.step(m, o, x, y)

    cases = {
        "before any recorded step": late,
        "rec.step(loss) is missing": forgotten,
        "twice in one recorded step": twice,
    }
    for i, (said, body) in enumerate(cases.items()):
        model = loops.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(UserError) as e:
            with audit.torch_recorder(tmp_path / str(i), model=model, optimizer=opt) as rec:
                body(rec, model, opt)
        assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    with audit.torch_recorder(tmp_path / "early", model=model, optimizer=opt) as rec:
        for _ in range(2):
            rec.batch(x)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            rec.step(loss)
            opt.step()
    run = read_recorded(tmp_path / "early")
    assert [s.grad_norm for s in run.steps] == pytest.approx(norms)
    assert [s.skipped for s in run.steps] == [False, False]


class NoLength(torch.utils.data.DataLoader):
    """A loader whose length fails as a broken custom loader's would."""

    def __len__(self):
        raise RuntimeError("this loader cannot say its length")


def test_a_recorder_that_fails_to_start_leaves_a_failed_folder_and_frees_the_process(tmp_path):
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = NoLength(torch.utils.data.TensorDataset(torch.rand(4, 16)), batch_size=2)
    with pytest.raises(RuntimeError, match="cannot say its length"):
        audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, loader=loader)
    assert json.loads((tmp_path / "a" / "audit.json").read_text())["state"] == "failed"
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:  # not refused
        rec.batch(torch.rand(2, 16))
        rec.step(1.0)
    assert read_recorded(tmp_path / "a").steps[0].samples == 2


@pytest.mark.slow  # two DDP processes started twice (~12 s)
def test_ddp_with_zero_and_a_folder_the_chief_refuses(tmp_path):
    """Two processes: ZeroRedundancyOptimizer is recorded as the optimizer it wraps; a folder
    the chief refuses is a one-line error in both processes, not a hang of the other one."""
    script = ("-m", "tests.audit.ddp_case")
    ok = run_python(*script, str(tmp_path / "a"), backend=Backend.TORCH, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    run = read_recorded(tmp_path / "a")
    assert run.config.json["optimizer"]["type"] == "AdamW"
    assert run.config.json["optimizer"]["wrapper"] == "ZeroRedundancyOptimizer"
    assert [s.samples for s in run.steps] == [8, 8]
    assert run.config.json["replicas"] == {  # every rank's parameters digested: one model
        "ranks": 2,
        "init": {},
        "init_arrays": {},
        "final": {},
        "final_arrays": {},
        "arrays": 2,
    }
    assert check_replicas(run, run).status == "PASS"
    bad = run_python(*script, str(tmp_path / "b"), "--foreign", backend=Backend.TORCH, timeout=120)
    assert bad.returncode != 0
    errors = [(tmp_path / f"b.rank{r}.err").read_text() for r in (0, 1)]
    assert all(e.count("\n") == 1 for e in errors), errors  # one line each
    assert "is not an audit record (no audit.json) and not empty" in errors[0]
    assert "the chief process (rank 0) could not prepare the audit folder" in errors[1]


def test_a_recorder_failing_in_one_ddp_process_stops_no_process(tmp_path):
    """Rank 1's recorder fails mid-loop (a failure of its own): both processes train to the end
    and in step; rank 0 does not wait for rank 1's part (nor hang at close's barrier), and the
    folder is marked failed."""
    proc = run_python(
        "-m",
        "tests.audit.ddp_case",
        str(tmp_path / "a"),
        "--rank1-fails",
        backend=Backend.TORCH,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("dualtrain audit: the recorder stopped at rec.batch") == 1
    assert json.loads((tmp_path / "a" / "audit.json").read_text())["state"] == "failed"
    weights = {(tmp_path / f"a.rank{r}.weight").read_text() for r in (0, 1)}
    assert len(weights) == 1  # trained in step


@pytest.mark.slow
@pytest.mark.sweep  # CI's time (docs/testing.md)
def test_replicas_that_train_apart_are_named(tmp_path):
    """A forward through DDP's .module (no gradient all-reduce) and ranks seeded apart without a
    broadcast: the chief's record alone looks like any run; every rank's weight digests and
    gradient norms show the replicas out of step, with the line to change."""
    script = ("-m", "tests.audit.ddp_case")
    runs = {}
    for mode in ("", "--bypass", "--apart"):
        out = tmp_path / (mode.strip("-") or "ddp")
        done = run_python(*script, str(out), *([mode] if mode else []), backend=Backend.TORCH)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = read_recorded(out)
    ddp, bypass, apart = runs[""], runs["--bypass"], runs["--apart"]
    assert check_replicas(ddp, ddp).status == "PASS"
    check = check_replicas(ddp, bypass)
    assert check.status == "FAIL", check
    assert "B's replicas step with different gradients (step 1)" in check.detail
    # ZeroRedundancyOptimizer broadcasts each rank's updated shard: the weights end equal, and
    # only the gradients show it
    assert "end with different weights" not in check.detail
    (found,) = replicas_apart(ddp, bypass)
    assert found.step == 1 and "step 1's gradient norms rank 0: " in found.evidence
    assert "ddp_case.py:" in found.fixes[0] and "not `model.module(x)`" in found.fixes[0], found
    check = check_replicas(apart, ddp)
    assert check.status == "FAIL" and "A's replicas start from different weights" in check.detail
    assert "step with different gradients" not in check.detail  # averaged by hand: equal
    (found,) = replicas_apart(apart, ddp)
    assert found.step == 0 and "the same seed on every rank" in found.fixes[0], found


@pytest.mark.slow
def test_a_recorder_in_some_processes_only_is_one_line_in_those_that_made_one(tmp_path):
    """A recorder on the chief only waits for the others' and refuses in one line, writing
    nothing (before, its first collective paired with DDP's and aborted gloo); recorders made
    before init_process_group are refused at the first rec.batch, each folder marked failed."""
    script = ("-m", "tests.audit.ddp_case")
    lone = run_python(*script, str(tmp_path / "a"), "--chief-only", backend=Backend.TORCH)
    assert lone.returncode != 0
    error = (tmp_path / "a.rank0.err").read_text()
    assert error.count("\n") == 1 and "rank(s) [1] made none in 3 s" in error, error
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.rank1.err").exists()
    early = run_python(*script, str(tmp_path / "b"), "--before-init", backend=Backend.TORCH)
    assert early.returncode != 0
    for r in (0, 1):
        error = (tmp_path / f"b.rank{r}.err").read_text()
        assert "made in a world of 1 process(es) but the loop trains in 2" in error, error
        state = json.loads((tmp_path / f"b.rank{r}" / "audit.json").read_text())["state"]
        assert state == "failed"


CRASH = """
import torch, dualtrain.audit as audit
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = audit.torch_recorder(OUT, model=model, optimizer=opt)  # no `with`, no close
for i in range(3):
    rec.batch(torch.rand(2, 4))
    if i == 1:
        raise RuntimeError("the script's own error")
    rec.step(1.0)
"""


def test_a_script_that_dies_with_its_recorder_open_leaves_a_failed_folder(tmp_path):
    out = tmp_path / "a"
    proc = run_python("-c", f"OUT = {str(out)!r}\n" + CRASH, backend=Backend.TORCH, timeout=60)
    assert proc.returncode != 0 and "the script's own error" in proc.stderr
    assert json.loads((out / "audit.json").read_text())["state"] == "failed"


#: each call the torch recorder makes into torch or its record, failing in turn in a hand-written
#: loop: (what is planted, which call fails, where the recorder says it stopped)
OWN_FAILURES = [
    ("dualtrain.backends.torch.audit.canonical_weights", 1, "rec.batch"),
    ("dualtrain.backends.torch.audit.Digests.add", 3, "rec.batch"),
    ("torch.nn.utils.get_total_norm", 2, "the optimizer step"),
    ("dualtrain.backends.torch.audit._loss_value", 2, "rec.step"),
    ("dualtrain.backends.torch.audit.final_config", 1, "rec.close"),
    ("dualtrain.audit.record.finish", 1, "rec.close"),
]


@pytest.mark.parametrize(
    ("target", "nth", "where"), OWN_FAILURES, ids=[t for t, *_ in OWN_FAILURES]
)
def test_a_failing_torch_recorder_never_stops_the_loop(
    tmp_path, monkeypatch, capsys, target, nth, where
):
    """Issue 48 item 5: a recorder failure of its own (not a misuse it names) is said once on
    stderr, the folder is marked failed (compare refuses it), and the loop trains every step;
    the process may start another recorder."""
    owner, _, attr = target.rpartition(".")
    module, _, cls = owner.rpartition(".")
    try:
        holder = importlib.import_module(owner)
    except ModuleNotFoundError:
        holder = getattr(importlib.import_module(module), cls)
    real, calls = getattr(holder, attr), {"n": 0}

    def planted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == nth:
            raise RuntimeError(f"planted in {attr}")
        return real(*args, **kwargs)

    monkeypatch.setattr(holder, attr, planted)
    model = loops.model()
    before = model[1].weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    with audit.torch_recorder(tmp_path / "rec", model=model, optimizer=opt) as rec:
        for _ in range(4):
            rec.batch(x)
            rec.step(loops.step(model, opt, x, y))
    assert opt.state_dict()["state"] == {} and not torch.equal(model[1].weight, before)
    err = capsys.readouterr().err
    assert err.count("dualtrain audit: the recorder stopped") == 1, err
    assert f"the recorder stopped at {where} and records nothing more" in err, err
    assert f"RuntimeError: planted in {attr}" in err
    assert json.loads((tmp_path / "rec" / "audit.json").read_text())["state"] == "failed"
    with pytest.raises(UserError):
        read_recorded(tmp_path / "rec")
    monkeypatch.undo()
    audit.torch_recorder(tmp_path / "again", model=model, optimizer=opt).close()  # free again
