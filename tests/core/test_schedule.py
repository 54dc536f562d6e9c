"""The lr schedule, per step and per epoch (dualtrain.core.schedule, shared by both backends)."""

import math

import pytest

from dualtrain.core.schedule import lr_at
from dualtrain.spec import load_spec


def opt(*overrides):
    return load_spec(None, list(overrides)).optimizer


def test_step_schedule_per_epoch_is_torch_steplr_stepped_after_each_epoch():
    # pytorch/examples mnist: StepLR(step_size=1, gamma=0.7), scheduler.step() after every epoch
    o = opt(
        "optimizer.lr=1.0",
        "optimizer.schedule.name=step",
        "optimizer.schedule.step_size=1",
        "optimizer.schedule.gamma=0.7",
        "optimizer.schedule.interval=epoch",
    )
    spe, total = 10, 30
    lrs = [lr_at(o, k, total, spe) for k in range(total)]
    assert lrs[:10] == [1.0] * 10 and lrs[10:20] == [0.7] * 10
    assert lrs[20:] == [pytest.approx(0.49)] * 10


def test_cosine_per_epoch_is_constant_within_an_epoch():
    o = opt(
        "optimizer.lr=0.1", "optimizer.schedule.name=cosine", "optimizer.schedule.interval=epoch"
    )
    lrs = [lr_at(o, k, 40, 10) for k in range(40)]
    per_epoch = [lrs[e * 10 : (e + 1) * 10] for e in range(4)]
    assert all(len(set(e)) == 1 for e in per_epoch)
    assert [e[0] for e in per_epoch] == pytest.approx(
        [0.1 * 0.5 * (1 + math.cos(math.pi * e / 4)) for e in range(4)]
    )


def test_per_step_is_unchanged_by_steps_per_epoch():
    o = opt("optimizer.schedule.name=step", "optimizer.schedule.step_size=3")
    assert [lr_at(o, k, 12, 4) for k in range(12)] == [lr_at(o, k, 12) for k in range(12)]


def test_eps_defaults_to_torchs_per_optimizer_and_is_written_into_the_spec():
    from dualtrain.spec import dump_spec

    assert opt("optimizer.name=adadelta").eps == 1e-6
    assert opt("optimizer.name=rmsprop").eps == 1e-8 and opt("optimizer.name=adam").eps == 1e-8
    assert opt("optimizer.name=adadelta", "optimizer.eps=1e-7").eps == 1e-7
    assert "eps: 1.0e-06" in dump_spec(load_spec(None, ["optimizer.name=adadelta"]))


def test_rmsprop_only_options_are_refused_elsewhere():
    from dualtrain.errors import UserError

    with pytest.raises(UserError, match="centered is for rmsprop"):
        opt("optimizer.name=sgd", "optimizer.centered=true")
    with pytest.raises(UserError, match="optimizer.rho"):
        opt("optimizer.name=adadelta", "optimizer.rho=1.5")
