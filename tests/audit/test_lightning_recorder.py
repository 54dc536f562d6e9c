"""The audit's Lightning callback: a Lightning fit records each optimizer step (gradient
accumulation's micro-batches in one step, the gradient norm of the step that ran, not the one
before: Lightning computes the gradient inside optimizer.step's closure), and a recorder that fails
at any of its calls says so once and never stops the training (the folder marked failed). The
example pair (examples/audit/lightning) PASSes faithful and names what is planted in it."""

from __future__ import annotations

import json

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dualtrain.audit as audit  # noqa: E402
from dualtrain.audit.compare import compare_recorded  # noqa: E402
from dualtrain.audit.read import read_recorded  # noqa: E402
from dualtrain.backends.torch.audit import TorchRecorder  # noqa: E402
from dualtrain.errors import UserError  # noqa: E402
from tests.audit.scripts import record  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback, accumulate: int = 1) -> Tiny:
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(32, 4), torch.randint(0, 3, (32,)))
    model = Tiny()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=4))
    return model


def test_a_lightning_fit_records_each_optimizer_step(tmp_path):
    _fit(audit.lightning_recorder(tmp_path / "rec"), accumulate=2)
    run = read_recorded(tmp_path / "rec")
    assert len(run.steps) == 8 and [s.epoch for s in run.steps] == [1] * 4 + [2] * 4
    assert all(r.batches == 2 and r.count == 8 for r in run.replicas.values())
    assert run.steps[0].grad_norm is not None and run.steps[0].grad_norm > 0
    assert run.config.json["optimizer"]["type"] == "SGD" and run.config.json["epochs"] == "script"


def test_the_gradient_norm_is_the_steps_own(tmp_path):
    """Lightning runs the closure (forward, backward) inside optimizer.step: a reading before
    the step gave the step before's gradient, and none at step 1. The same steps replayed by
    hand give the recorded norms."""
    _fit(audit.lightning_recorder(tmp_path / "rec"))
    recorded = [s.grad_norm for s in read_recorded(tmp_path / "rec").steps[:3]]
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(32, 4), torch.randint(0, 3, (32,)))
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x, y), norm in zip(DataLoader(data, batch_size=4), recorded, strict=False):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model.net(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        assert norm == pytest.approx(float(torch.nn.utils.get_total_norm(grads)), rel=1e-6)
        opt.step()


#: each call the callback makes into the recorder, failing in turn
HOOK_CALLS = {
    "on_train_start": "__init__",
    "on_train_batch_start": "batch",
    "on_train_batch_end": "step",
    "on_train_end": "close",
}


@pytest.mark.parametrize("hook", list(HOOK_CALLS))
def test_a_failing_recorder_never_stops_the_training(tmp_path, monkeypatch, capsys, hook):
    method = HOOK_CALLS[hook]
    real = getattr(TorchRecorder, method)
    calls = {"n": 0}

    def planted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == (1 if method in ("__init__", "close") else 3):
            raise RuntimeError(f"planted in {method}")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchRecorder, method, planted)
    before = Tiny().net.weight.detach().clone()
    model = _fit(audit.lightning_recorder(tmp_path / "rec"))
    assert not torch.equal(model.net.weight, before)  # trained all the same
    err = capsys.readouterr().err
    line = f"dualtrain audit: the recorder stopped at {hook} and records nothing more"
    assert err.count(line) == 1, err
    assert f"RuntimeError: planted in {method}" in err
    meta = tmp_path / "rec" / "audit.json"  # (none where the recorder never began)
    assert not meta.exists() or json.loads(meta.read_text())["state"] != "complete"
    with pytest.raises(UserError):
        read_recorded(tmp_path / "rec")  # refused, never read as a record


def test_a_recorder_that_cannot_start_says_why_and_the_fit_goes_on(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    _fit(audit.lightning_recorder(tmp_path / "file"))
    err = capsys.readouterr().err
    assert "the recorder stopped at on_train_start" in err
    assert "the audit run directory is a file" in err


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    return record("lightning/lit_mnist.py", tmp_path_factory.mktemp("lit") / "torch")


@pytest.fixture(scope="module")
def keras_port(lightning_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("lit") / "keras"
    return record("lightning/keras_mnist.py", out, "--torch-record", str(lightning_run))


@pytest.mark.slow
def test_the_lightning_example_and_its_keras_port_pass(lightning_run, keras_port):
    cmp = compare_recorded(lightning_run, keras_port)
    assert cmp.passed and not cmp.findings, cmp.verdict
    assert [c.status for c in cmp.checks] == ["PASS"] * 8
    assert [len(r.exact) for r in cmp.a.rows(1)] == [64, 64]  # DDP over 2 processes


#: (the script planted, its flags, the difference named, the value its fix writes)
PLANTS = [
    ("lit_mnist.py", ("--lr", "1e-3"), "different base learning rate", "lr=0.0002"),
    ("lit_mnist.py", ("--warmup", "4"), "warmup in one run only", "warmup_target=0.0002"),
    ("lit_mnist.py", ("--weight-decay", "1e-4"), "optimizer conventions", "L2(5e-05)"),
    ("lit_mnist.py", ("--clip", "0.5"), "gradient clipping in one run only", "clipnorm=0.5"),
    ("lit_mnist.py", ("--accumulate", "2"), "gradient accumulation", "accumulate_grad_batches=1"),
    ("keras_mnist.py", ("--epsilon", "1e-7"), "optimizer conventions", "epsilon=1e-08"),
    ("keras_mnist.py", ("--shuffle",), "shuffle seeds", "permutation("),
]


@pytest.mark.slow
@pytest.mark.sweep  # 7 more runs of a Lightning DDP or Keras fit: the full sweep's
@pytest.mark.parametrize("script,flags,name,value", PLANTS, ids=[p[2] for p in PLANTS])
def test_a_difference_planted_in_the_lightning_pair_is_named_with_its_value(
    lightning_run, keras_port, tmp_path, script, flags, name, value
):
    if script == "lit_mnist.py":
        a, b = record(f"lightning/{script}", tmp_path / "a", *flags), keras_port
    else:
        extra = ("--torch-record", str(lightning_run), *flags)
        a, b = lightning_run, record(f"lightning/{script}", tmp_path / "b", *extra)
    cmp = compare_recorded(a, b)
    assert not cmp.passed, cmp.verdict
    (found,) = [f for f in cmp.findings if f.name.startswith(name)] or [None]
    assert found is not None, [f.name for f in cmp.findings]
    assert any(value in x for x in found.fixes), found.fixes
    assert not [c for c in found.fix_checks if c and not c.holds], (
        found.fix_lines()
    )  # none NOT confirmed


@pytest.mark.slow
@pytest.mark.sweep  # four more runs
def test_what_a_keras_loss_adds_is_read_and_named_with_its_values(tmp_path):
    """Label smoothing and L2 regularizers in the Keras port (issue 48: a regularizer was called
    'Keras's weight_decay is decoupled', with a fix that would decay twice; label smoothing was
    named by nothing). With no dropout on either side, step 1's loss names the loss's terms; L2
    regularizers are a coupled weight decay's gradient, named against a torch script without one
    and not against one with weight_decay = 2 * l2."""
    lit = record("lightning/lit_mnist.py", tmp_path / "lit", "--dropout", "0")
    port = ("--torch-record", str(lit), "--dropout", "0")
    smooth = record("lightning/keras_mnist.py", tmp_path / "ls", *port, "--label-smoothing", "0.1")
    (f,) = [f for f in compare_recorded(lit, smooth).findings if f.name == "different loss"]
    assert "B's compiled loss has label_smoothing=0.1" in f.evidence, f.evidence
    assert "CrossEntropyLoss(label_smoothing=0.1)" in f.fixes[0], f.fixes
    assert "label_smoothing=0 in the loss" in f.fixes[1], f.fixes
    l2 = record("lightning/keras_mnist.py", tmp_path / "l2", *port, "--l2", "5e-5")
    found = {f.name: f for f in compare_recorded(lit, l2).findings}
    conv = found["optimizer conventions (momentum, epsilon, weight decay)"]
    assert "Keras's L2(5e-05) regularizers add 0.0001 * w to each gradient" in conv.evidence
    assert conv.fixes[1].endswith("weight_decay=0.0001"), conv.fixes
    decayed = record(
        "lightning/lit_mnist.py", tmp_path / "wd", "--dropout", "0", "--weight-decay", "1e-4"
    )
    names = [f.name for f in compare_recorded(decayed, l2).findings]
    assert not [n for n in names if n.startswith("optimizer conventions")], names
