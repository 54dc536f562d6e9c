"""What the torch recorder sees the script do while it records (the seventh round of unseen
scripts): the loops over an IterableDataset's loader (its epochs), a parameter group added after
the recorder was made, an AveragedModel's average copied into the model, the line that steps the
scheduler, and a SyncBatchNorm."""

from __future__ import annotations

import io
import json
import pickle
import sys

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import dualtrain.audit as audit
from dualtrain.audit.checks import check_settings
from dualtrain.audit.read import read_recorded
from dualtrain.backends.torch.audit_setup import read_config
from dualtrain.errors import UserError
from tests.audit import torch_loops as loops


def test_an_iterable_datasets_epochs_are_its_loops_over_the_loader(tmp_path, capsys):
    """loader= given, no epoch=: the recorder said 'no loader or sampler given' and recorded the
    epochs unknown (compare then judged the steps' total only)."""
    x, y = torch.rand(12, 1, 4, 4), torch.randint(0, 4, (12,))
    loader = torch.utils.data.DataLoader(loops.Stream(x, y), batch_size=4)
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, loader=loader) as rec:
        for _ in range(2):
            for xb, yb in loader:
                rec.batch(xb)
                rec.step(loops.step(model, opt, xb, yb))
    assert "no loader or sampler given" not in capsys.readouterr().err
    run = read_recorded(tmp_path / "a")
    assert run.config.json["epochs"] == "counted"
    assert [s.epoch for s in run.steps] == [1, 1, 1, 2, 2, 2]


def _unfreeze(tmp_path, name: str, when: str, head_lr: float = 0.1):
    """The body's optimizer recorded; the head added to it right after the recorder was made
    (``early``), at the second step (``late``, frozen until then) or never (``none``)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    torch.manual_seed(0)
    if when == "late":
        model[2].requires_grad_(False)
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
        if when == "early":
            opt.add_param_group({"params": model[2].parameters(), "lr": head_lr})
        for i in range(2):
            if when == "late" and i == 1:
                model[2].requires_grad_(True)
                opt.add_param_group({"params": model[2].parameters(), "lr": head_lr})
            rec.batch(x[4 * i : 4 * i + 4])
            rec.step(loops.step(model, opt, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]))
    return read_recorded(tmp_path / name)


def test_a_group_added_after_the_recorder_was_made_is_held(tmp_path, capsys):
    """add_param_group after torch_recorder(...): 'parameters outside the recorded optimizer',
    a false FAIL, because the optimizer was read as the recorder was made."""
    early = _unfreeze(tmp_path, "early", "early")
    assert "not_held" not in early.config.json and "trainable" not in capsys.readouterr().err
    assert len(early.config.json["optimizer"]["groups"]) == 2  # as the first step began
    late = _unfreeze(tmp_path, "late", "late")
    assert "not_held" not in late.config.json  # held from step 2
    assert late.config.json["frozen"] == {"2.weight": 32, "2.bias": 4}  # as the recorder was made
    never = _unfreeze(tmp_path, "never", "none")
    assert never.config.json["not_held"] == {"names": ["2.weight", "2.bias"], "of": 4}
    assert check_settings(early, never).status == "FAIL"


def _ema(tmp_path, name: str, copied: bool):
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
        for i in range(2):
            rec.batch(x[4 * i : 4 * i + 4])
            loss = loops.step(model, opt, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
            ema.update_parameters(model)
            rec.step(loss)
        if copied:
            model.load_state_dict(ema.module.state_dict())
    return read_recorded(tmp_path / name)


def test_an_averaged_models_average_copied_into_the_model_is_recorded(tmp_path):
    """An AveragedModel (EMA) whose average the script writes into the model, as Keras's use_ema
    does: compare said 'torch keeps none' against use_ema (a false FAIL)."""
    run = _ema(tmp_path, "copied", True)
    assert run.config.json["ema"] == {
        "type": "AveragedModel",
        "average": "ema",
        "decay": 0.99,
        "updates": 2,
        "final_is_average": True,
    }
    assert _ema(tmp_path, "kept", False).config.json["ema"]["final_is_average"] is False
    assert AveragedModel.update_parameters.__name__ == "update_parameters"  # put back


def test_the_line_that_steps_the_scheduler_is_recorded_and_a_checkpoint_pickles(
    tmp_path, monkeypatch
):
    """The quote for 'scheduler stepped per epoch' was the first `scheduler.step()` of the text
    (a per-batch branch that did not run); the line is read as the call runs, on the class, so
    a checkpoint of the scheduler's state (its __dict__) still pickles."""
    monkeypatch.setattr(sys, "argv", [__file__])  # this file is the script that records
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, scheduler=sched) as rec:
        for i in range(2):
            rec.batch(x[4 * i : 4 * i + 4])
            rec.step(loops.step(model, opt, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]))
            torch.save({"sched": sched.state_dict()}, io.BytesIO())
            pickle.dumps(sched.state_dict())
            line = sys._getframe().f_lineno + 1
            sched.step()
    run = read_recorded(tmp_path / "a")
    assert run.config.json["scheduler"]["step_lines"] == [line]
    assert run.line_at(line).endswith(": sched.step()")
    assert "step" not in vars(torch.optim.lr_scheduler.StepLR)  # the class put back


def test_a_sync_batchnorm_is_recorded_as_synchronised():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    plain = read_config(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, None, None)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    sync = read_config(synced, torch.optim.SGD(synced.parameters(), lr=0.1), *[None] * 4)
    assert [b["synchronized"] for b in plain["batchnorm"] + sync["batchnorm"]] == [False, True]


def test_a_validation_batch_given_to_rec_batch_is_one_line(tmp_path):
    """rec.batch under torch.no_grad() with the model in eval mode: its rows were added to the
    next optimizer step and its epoch counted otherwise (round 10), silently."""
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    with pytest.raises(UserError, match="call it only for the batches the optimizer steps on"):
        with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
            rec.batch(x[:4], epoch=1)
            rec.step(loops.step(model, opt, x[:4], y[:4]))
            model.eval()
            with torch.no_grad():
                rec.batch(x[4:], epoch=1)
    assert json.loads((tmp_path / "a" / "audit.json").read_text())["state"] == "failed"
    with audit.torch_recorder(tmp_path / "b", model=model, optimizer=opt) as rec:
        with torch.no_grad():  # rows prepared without autograd, the model training: a step
            model.train()
            rec.batch(x[:4], epoch=1)
        rec.step(loops.step(model, opt, x[:4], y[:4]))
    assert read_recorded(tmp_path / "b").steps[0].samples == 4
