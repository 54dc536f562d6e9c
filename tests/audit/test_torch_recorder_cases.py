"""The torch recorder on script patterns beyond examples/audit (found by recording scripts it
had not seen): an iterable dataset, a bfloat16 model, an lr set after rec.batch, dict batches,
a loop that leaves its epochs early, clipping, a second optimizer, eval mode, autocast (misuse
and failures: test_torch_recorder_misuse.py)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.nn.utils import clip_grad_norm_, clip_grads_with_norm_, get_total_norm

import dualtrain.audit as audit
from dualtrain.audit.checks import check_settings, run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.identity import row_digests
from dualtrain.audit.read import read_recorded
from tests.audit import torch_loops as loops


def test_an_iterable_dataset_and_a_bfloat16_model_are_recorded(tmp_path):
    x, y = torch.rand(12, 1, 4, 4), torch.randint(0, 4, (12,))
    loader = torch.utils.data.DataLoader(loops.Stream(x, y), batch_size=4)
    model = loops.model(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = model[1].weight.detach().float().clone()
    norms = []
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, loader=loader) as rec:
        for epoch in (1, 2):
            for xb, yb in loader:
                rec.batch(xb, epoch=epoch)
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(xb.bfloat16()).float(), yb)
                loss.backward()
                grads = [p.grad.double() for p in model.parameters()]
                norms.append(float(torch.cat([g.flatten() for g in grads]).norm()))
                opt.step()
                rec.step(loss)
    run = read_recorded(tmp_path / "a")
    # the norm of bfloat16 gradients summed in float32 (bfloat16's own sum is ~0.5% off)
    assert [s.grad_norm for s in run.steps] == pytest.approx(norms, rel=1e-5)
    assert [s.epoch for s in run.steps] == [1, 1, 1, 2, 2, 2]
    assert list(run.replicas[(1, 0)].exact) == row_digests(x[:4].numpy())[0]
    assert torch.equal(torch.from_numpy(run.weights_init["1.weight"]), first)
    assert run.config.json["precision"] == {  # no autocast: a bfloat16 model computes in bfloat16
        "param_dtype": "bfloat16",
        "autocast": None,
        "compute_dtype": "bfloat16",
    }
    assert run.config.json["loader"]["batches"] is None


def test_the_lr_is_the_one_the_step_used(tmp_path):
    """A script that sets the lr after rec.batch (MAE's and DeiT's adjust_learning_rate)."""
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x, y = torch.rand(16, 1, 4, 4), torch.randint(0, 4, (16,))
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
        for i in range(4):
            rec.batch(x[4 * i : 4 * i + 4])
            for group in opt.param_groups:
                group["lr"] = 0.1 * (i + 1)
            rec.step(loops.step(model, opt, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]))
    lrs = [s.lr for s in read_recorded(tmp_path / "a").steps]
    assert lrs == pytest.approx([0.1, 0.2, 0.3, 0.4], rel=1e-12)


def test_a_dict_batch_digests_its_input_whatever_the_key_order(tmp_path):
    x = torch.rand(8, 16)
    for name, batch in (
        ("labels_first", {"labels": torch.arange(8), "pixel_values": x}),
        ("userdict", collections.UserDict({"attention_mask": torch.ones(8, 16), "features": x})),
    ):
        model = loops.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
            rec.batch(batch)
            rec.step(1.0)
        assert (
            list(read_recorded(tmp_path / name).replicas[(1, 0)].exact) == row_digests(x.numpy())[0]
        )


def test_a_loop_leaving_its_epochs_early_is_counted_by_set_epoch(tmp_path):
    data = torch.utils.data.TensorDataset(torch.rand(24, 1, 4, 4), torch.randint(0, 4, (24,)))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, loader=loader) as rec:
        for epoch in range(3):
            sampler.set_epoch(epoch)
            order = list(sampler)
            for i, (xb, yb) in enumerate(loader):
                if i == 2:  # max_steps per epoch
                    break
                seen.append(order[4 * i : 4 * i + 4])
                rec.batch(xb)  # no epoch=: the sampler's epoch says it
                rec.step(loops.step(model, opt, xb, yb))
    run = read_recorded(tmp_path / "a")
    assert [s.epoch for s in run.steps] == [1, 1, 2, 2, 3, 3]
    assert [list(run.replicas[(s, 0)].indices) for s in range(1, 7)] == seen


def test_an_option_of_a_later_parameter_group_is_judged(tmp_path):
    x = torch.rand(8, 16)
    for name, decay in (("a", 0.0), ("b", 0.1)):
        model = loops.model()
        groups = [{"params": [model[1].weight]}, {"params": [model[1].bias], "weight_decay": decay}]
        opt = torch.optim.AdamW(groups, lr=1e-3)
        with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
            rec.batch(x)
            rec.step(1.0)
    settings = check_settings(read_recorded(tmp_path / "a"), read_recorded(tmp_path / "b"))
    assert settings.status == "FAIL" and "different optimizer settings" in settings.detail
    (f,) = [f for f in diagnose(read_recorded(tmp_path / "a"), read_recorded(tmp_path / "b"))]
    assert "group 1's weight_decay" in f.evidence


def test_clipping_is_recorded_as_it_runs_whatever_name_the_script_imported(tmp_path):
    """clip_grad_norm_ and the two-step clip_grads_with_norm_ imported by name before the
    recorder, a limit of inf that only measures the norm, clip_grad_value_, and a clip under an
    ``if`` that never runs: the record holds the
    calls made, and torch's module is as it was once the recorder closes."""
    module = torch.nn.utils.clip_grad
    fns = (module._clip_grads_with_norm_, module.clip_grad_value_, module.clip_grad_norm_)
    before = [f.__closure__[0].cell_contents for f in fns]
    x, y = torch.rand(24, 1, 4, 4) * 50, torch.randint(0, 4, (24,))
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    active = 0
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
        for i in range(6):
            xb, yb = x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]
            rec.batch(xb)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            clip_grad_norm_(model.parameters(), float("inf"))  # a logged norm: clips nothing
            if i % 2 == 0:
                active += int(clip_grad_norm_(model.parameters(), 2.0) > 2.0)
            torch.nn.utils.clip_grad_value_(model.parameters(), 5.0)
            if i == 5:  # the two-step API, imported by name before the recorder
                total = get_total_norm(loops.grads(model))
                active += int(total > 3.0)
                clip_grads_with_norm_(model.parameters(), 3.0, total)
            if i > 100:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # never runs
            opt.step()
            rec.step(loss)
    assert [f.__closure__[0].cell_contents for f in fns] == before
    calls = read_recorded(tmp_path / "a").config.json["clipping"]["calls"]
    norm, value = calls
    assert norm["function"] == "clip_grad_norm_"
    assert [float(v) for v in norm["limit"]] == [2.0, 3.0, float("inf")]
    assert norm["steps"] == 6 and norm["active_steps"] == active > 0
    assert value == {"function": "clip_grad_value_", "limit": 5.0, "steps": 6, "active_steps": None}


def test_parameters_a_second_optimizer_steps_are_named_and_judged(tmp_path, capsys):
    """A body's optimizer recorded, the head's not (a frozen parameter is no one's): the
    recorder says so as it starts, and compare names the parameters against a run whose
    optimizer holds them all; the same script twice agrees."""

    def run(name, split):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)
        )
        model[1].bias.requires_grad_(False)
        body = [model[1].weight] + ([] if split else list(model[2].parameters()))
        opt = torch.optim.SGD(body, lr=0.1)
        head = torch.optim.SGD(model[2].parameters(), lr=0.5) if split else None
        x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
        with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
            for i in range(2):
                rec.batch(x[4 * i : 4 * i + 4])
                loss = loops.step(model, opt, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
                if head is not None:
                    head.step()
                rec.step(loss)
        return read_recorded(tmp_path / name)

    split = run("split", True)
    warned = capsys.readouterr().err
    assert "holds 1 of the model's 3 trainable parameters; 2.weight, 2.bias are another" in warned
    assert split.config.json["not_held"] == {"names": ["2.weight", "2.bias"], "of": 3}
    assert split.config.json["frozen"] == {"1.bias": 8}
    whole = run("whole", False)
    assert "not_held" not in whole.config.json and "trainable" not in capsys.readouterr().err
    (f,) = [
        f for f in diagnose(split, whole) if f.name == "parameters outside the recorded optimizer"
    ]
    assert "A's recorded optimizer does not hold 2 of its 3 trainable parameters" in f.evidence
    assert check_settings(split, whole).status == "FAIL"
    assert check_settings(split, run("again", True)).status == "PASS"


def test_the_initial_weights_are_those_the_first_step_starts_from(tmp_path):
    """A checkpoint loaded after the recorder was made (a resume): the record's initial weights
    are the loaded ones, which the first step uses, not the fresh ones."""
    model = loops.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items()}
    x, y = torch.rand(4, 1, 4, 4), torch.randint(0, 4, (4,))
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt) as rec:
        model.load_state_dict(saved)
        rec.batch(x)
        rec.step(loops.step(model, opt, x, y))
    init = read_recorded(tmp_path / "a").weights_init
    assert sorted(init) == ["1.bias", "1.weight"]
    assert all((init[k] == 0.25).all() for k in init)


def test_a_recorder_without_loader_sampler_or_epoch_says_so_and_compare_judges_the_total(
    tmp_path, capsys
):
    """The fourth round's HF-style loop: no loader given, no epoch=: every step fell in epoch 1
    and two identical scripts FAILed 'steps' with nothing named. The recorder now says so as it
    starts, and compare judges the steps' total against the same script given its loader."""
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 4, (8,))
    data = torch.utils.data.TensorDataset(x, y)
    for name, give in (("blind", False), ("loader", True)):
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        model = loops.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kw = {"loader": loader} if give else {}
        with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt, **kw) as rec:
            for _ in range(2):
                for xb, yb in loader:
                    rec.batch(xb)
                    rec.step(loops.step(model, opt, xb, yb))
        said = capsys.readouterr().err
        assert ("every step is counted in epoch 1" in said) == (not give), said
    blind, counted = (read_recorded(tmp_path / n) for n in ("blind", "loader"))
    assert blind.config.json["epochs"] == "unknown" and counted.config.json["epochs"] == "counted"
    assert [s.epoch for s in counted.steps] == [1, 1, 2, 2]
    steps = run_checks(blind, counted)[0]
    assert steps.name == "steps" and steps.status == "PASS", steps.detail
    assert "A's epochs unknown" in steps.not_judged


def _loop(out, *, forget_train=False, sched_first=False, batch_sampler=False):
    """Two epochs of 4 batches with an evaluation after each, a StepLR per step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2)
    )
    data = torch.utils.data.TensorDataset(torch.rand(32, 16), torch.randint(0, 2, (32,)))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, seed=3)
    if batch_sampler:
        batches = torch.utils.data.BatchSampler(sampler, batch_size=8, drop_last=False)
        loader = torch.utils.data.DataLoader(data, batch_sampler=batches)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    with audit.torch_recorder(
        out, model=model, optimizer=opt, loader=loader, scheduler=sched
    ) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            if not forget_train or epoch == 0:
                model.train()
            for x, y in loader:
                rec.batch(x)
                if sched_first:
                    sched.step()
                loops.step(model, opt, x, y)
                rec.step(1.0)
                if not sched_first:
                    sched.step()
            model.eval()
    return read_recorded(out)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_eval_mode_a_scheduler_stepped_first_and_a_batch_samplers_indices(tmp_path):
    """model.train() not called after the first evaluation, scheduler.step() before
    optimizer.step() and a DistributedSampler inside a BatchSampler were each recorded as a
    correct loop (or without indices) in the fifth round."""
    base = _loop(tmp_path / "base")
    assert base.config.json["eval_steps"] == [] and base.config.json["mode_layers"] == [
        "1 (Dropout)"
    ]
    assert "before_optimizer" not in base.config.json["scheduler"]
    late = _loop(tmp_path / "eval", forget_train=True)
    assert late.config.json["eval_steps"] == [5, 6, 7, 8]
    (f,) = [f for f in diagnose(base, late) if f.name.startswith("training steps in eval mode")]
    assert f.step == 5 and "B trains 4 of 8 steps" in f.evidence and "(1 (Dropout))" in f.evidence
    assert "call model.train() before each epoch's training loop" in f.fixes[0]
    assert {c.name: c.status for c in run_checks(base, late)}["settings"] == "FAIL"
    first = _loop(tmp_path / "first", sched_first=True)
    assert first.config.json["scheduler"]["before_optimizer"] is True
    names = [f.name for f in diagnose(base, first)]
    assert "scheduler stepped before optimizer.step()" in names, names
    batches = _loop(tmp_path / "bs", batch_sampler=True)
    assert batches.config.json["sampler"]["type"] == "DistributedSampler"
    assert [r.indices for r in batches.replicas.values()] == [
        r.indices for r in base.replicas.values()
    ]
    assert all(r.indices for r in batches.replicas.values())


def test_a_loop_that_leaves_its_epochs_early_without_set_epoch_has_its_epochs(tmp_path):
    """No set_epoch, a break after 2 of 4 batches: the epochs used to be counted by the loader's
    length (4 steps in epoch 1), so an identical run with set_epoch FAILed its steps check. Each
    new loop over the loader is an epoch; the loader is left as it was."""
    model = loops.model()
    data = torch.utils.data.TensorDataset(torch.rand(16, 16), torch.randint(0, 4, (16,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    next(iter(loader))  # a peek before training is not an epoch
    with audit.torch_recorder(tmp_path / "a", model=model, optimizer=opt, loader=loader) as rec:
        for _ in range(3):
            for i, (x, y) in enumerate(loader):
                if i == 2:
                    break
                rec.batch(x)
                loops.step(model, opt, x, y)
                rec.step(1.0)
    assert [s.epoch for s in read_recorded(tmp_path / "a").steps] == [1, 1, 2, 2, 3, 3]
    assert "_get_iterator" not in vars(loader)


def test_autocast_is_recorded_as_the_compute_dtype(tmp_path):
    """A torch float32 run against Keras's mixed_bfloat16 PASSed: autocast was never recorded.
    The first forward's autocast context is now the torch run's compute dtype."""
    x, y = torch.rand(8, 16), torch.randint(0, 4, (8,))
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = loops.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with audit.torch_recorder(tmp_path / name, model=model, optimizer=opt) as rec:
            for _ in range(2):
                rec.batch(x)
                with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=bool(dtype)):
                    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss)
    fp32, bf16 = read_recorded(tmp_path / "fp32"), read_recorded(tmp_path / "bf16")
    assert fp32.config.json["precision"] == {
        "param_dtype": "float32",
        "autocast": None,
        "compute_dtype": "float32",
    }
    assert bf16.config.json["precision"]["compute_dtype"] == "bfloat16"
    (f,) = [f for f in diagnose(fp32, bf16) if f.name.startswith("different compute dtype")]
    assert "`torch.autocast(device_type, dtype=torch.bfloat16)` around the forward" in f.fixes[0]
    assert "no autocast (float32), as A" in f.fixes[1], f.fixes
