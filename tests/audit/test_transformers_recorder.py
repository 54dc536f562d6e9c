"""The audit's Hugging Face Trainer callback: a Trainer's training recorded step by step (the rows
read from the model's training forwards, the loss it returns, averaged over accumulated
micro-batches), checked against what the Trainer itself logs for each step (loss, gradient norm,
learning rate); evaluation forwards are not rows."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402

import dualtrain.audit as audit  # noqa: E402
from dualtrain.audit.read import read_recorded  # noqa: E402
from dualtrain.errors import UserError  # noqa: E402


class Tiny(torch.nn.Module):
    """A model as the Trainer calls it: keyword inputs, a dict with the loss."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.rand(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


@pytest.mark.parametrize("accumulate", [2])  # (1: a micro-batch a step, as any loop)
def test_a_trainer_is_recorded_as_it_logs_each_step(tmp_path, accumulate):
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulate,
        num_train_epochs=2,
        learning_rate=0.05,
        warmup_steps=2,
        logging_steps=1,
        eval_strategy="epoch",
        per_device_eval_batch_size=8,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=Tiny(),
        args=args,
        train_dataset=Rows(32),
        eval_dataset=Rows(8),
        callbacks=[audit.transformers_recorder(tmp_path / "rec")],
    )
    trainer.train()
    run = read_recorded(tmp_path / "rec")
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    steps = 16 // accumulate
    assert len(run.steps) == steps == len(logged)
    assert [s.epoch for s in run.steps] == [1] * (steps // 2) + [2] * (steps // 2)
    assert all(r.count == 4 * accumulate and r.batches == accumulate for r in run.replicas.values())
    assert [s.lr for s in run.steps] == pytest.approx([h["learning_rate"] for h in logged])
    assert [s.loss for s in run.steps] == pytest.approx([h["loss"] for h in logged], rel=1e-4)
    # the Trainer logs the norm before clipping (max_grad_norm 1.0): equal where it did not clip
    unclipped = [
        (s.grad_norm, h["grad_norm"])
        for s, h in zip(run.steps, logged, strict=True)
        if h["grad_norm"] < 1
    ]
    assert unclipped and all(a == pytest.approx(b, rel=1e-5) for a, b in unclipped)
    assert (
        run.config.json["optimizer"]["type"] == "AdamW"
        and run.config.json["scheduler"]["type"] == "LambdaLR"
    )


class OwnLoss(transformers.Trainer):
    """A stranger's Trainer: the loss computed in an overridden compute_loss (class weights),
    the model returning logits only."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        weight = torch.tensor([1.0, 2.0, 3.0])
        loss = torch.nn.functional.cross_entropy(out["logits"], labels, weight=weight)
        return (loss, out) if return_outputs else loss


def test_a_loss_the_trainer_computes_is_recorded(tmp_path):
    """Where the model returns no loss (an overridden compute_loss; the Trainer's own label
    smoothing computes it there too), the record had none at any step (the loss trajectory not
    judged); now the loss compute_loss returns is recorded, as the Trainer logs it, and
    compute_loss is the Trainer's own again after training."""
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = OwnLoss(
        model=Tiny(),
        args=args,
        train_dataset=Rows(16),
        callbacks=[audit.transformers_recorder(tmp_path / "rec")],
    )
    trainer.train()
    run = read_recorded(tmp_path / "rec")
    logged = [h["loss"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(run.steps) == len(logged) == 4
    assert [s.loss for s in run.steps] == pytest.approx(logged, rel=1e-4)
    assert "compute_loss" not in vars(trainer)


@pytest.mark.parametrize("method", ["__init__", "batch", "step", "close"])
def test_a_failing_recorder_never_stops_the_trainer(tmp_path, monkeypatch, capsys, method):
    from dualtrain.backends.torch.audit import TorchRecorder

    real, calls = getattr(TorchRecorder, method), {"n": 0}

    def planted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == (1 if method in ("__init__", "close") else 3):
            raise RuntimeError(f"planted in {method}")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchRecorder, method, planted)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    model = Tiny()
    before = model.net.weight.detach().clone()
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(16),
        callbacks=[audit.transformers_recorder(tmp_path / "rec")],
    )
    trainer.train()
    assert trainer.state.global_step == 4 and not torch.equal(model.net.weight, before)
    err = capsys.readouterr().err
    assert err.count("dualtrain audit: the recorder stopped at") == 1, err
    assert f"RuntimeError: planted in {method}" in err
    with pytest.raises(UserError):
        read_recorded(tmp_path / "rec")
