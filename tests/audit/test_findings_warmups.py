"""Issue 48's learning-rate findings that would have made things worse: a warmup on one side read
as a scheduler stepped per epoch against per step (the fix, stepping a StepLR every optimizer
step, would halve the lr every step), a LambdaLR warmup read as a different base lr (the recorded
lr is the warmup's scaled one, not the optimizer's), and two per-epoch schedules over epochs of
different lengths read as two schedules."""

from __future__ import annotations

from dualtrain.audit.diagnose import diagnose
from tests.audit.records import edit_steps, record, with_lrs, with_rows

TORCH = """\
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for epoch in range(4):
    sched.step()
"""
TORCH_WARMUP = """\
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
"""
KERAS = """\
lr = WarmupThenStaircase(1e-3, warmup_steps=2)
opt = keras.optimizers.SGD(learning_rate=lr)
"""


def _names(a, b) -> dict:
    return {f.name: f for f in diagnose(a, b)}


def _halving(n: int, per_epoch: int = 2) -> list[float]:
    return [1e-3 * 0.5 ** (i // per_epoch) for i in range(n)]


def test_a_warmup_on_one_side_is_named_as_a_warmup_not_a_per_step_scheduler():
    """StepLR(gamma=0.5) per epoch against a Keras schedule with a two-step warmup, then the same
    halving per epoch: the report said 'scheduler stepped per epoch vs per step' and told the torch
    script to step its StepLR every optimizer step."""
    a = with_lrs(record("torch", losses=[1.0] * 8, script=TORCH), _halving(8))
    a.config = a.config.edited({"scheduler": {"type": "StepLR", "step_lines": [4]}})
    a.config = a.config.edited({"optimizer": {"type": "SGD", "lr": 1e-3, "initial_lr": 1e-3}})
    warm = [5e-4, *_halving(8)[1:]]
    b = with_lrs(record("tf", losses=[1.0] * 8, script=KERAS), warm)
    b.config = b.config.edited(
        {"optimizer": {"type": "SGD", "learning_rate": "WarmupThenStaircase"}}
    )
    found = _names(a, b)
    assert set(found) == {"warmup in one run only"}, found
    f = found["warmup in one run only"]
    assert f.step == 1
    assert "B's lr rises from 0.0005 at step 1 to 0.001 at step 2" in f.evidence, f.evidence
    assert "A's starts at 0.001" in f.evidence
    # the values to write: a torch warmup reaching the same lr at the same step, chained before
    # the StepLR; or no warmup in the Keras schedule
    assert "LinearLR(opt, start_factor=0.5, total_iters=1)" in f.fixes[0], f.fixes
    assert "torch.py:2: sched = torch.optim.lr_scheduler.StepLR(" in f.fixes[0]
    assert "tf.py:1: lr = WarmupThenStaircase(" in f.fixes[1], f.fixes
    assert "learning_rate=0.001 from step 1" in f.fixes[1]
    assert not any("scheduler.step()" in x for x in f.fixes), f.fixes  # the StepLR stays per epoch


def test_a_lambda_warmup_against_a_shorter_keras_one_is_no_base_lr_difference():
    """A torch LambdaLR warmup over 4 steps against a Keras warmup over 2, both to 1e-3: the
    report added 'different base learning rate' with lr=0.0005 to write (step 1's scaled lr)."""
    torch_lrs = [min(1.0, (s + 1) / 4) * 1e-3 for s in range(8)]
    a = with_lrs(record("torch", losses=[1.0] * 8, script=TORCH_WARMUP), torch_lrs)
    a.config = a.config.edited({"scheduler": {"type": "LambdaLR", "step_lines": []}})
    a.config = a.config.edited({"optimizer": {"type": "AdamW", "lr": 2.5e-4, "initial_lr": 1e-3}})
    keras_lrs = [min(1.0, (s + 1) / 2) * 1e-3 for s in range(8)]
    b = with_lrs(record("tf", losses=[1.0] * 8, script=KERAS), keras_lrs)
    b.config = b.config.edited(
        {"optimizer": {"type": "AdamW", "learning_rate": "WarmupThenStaircase"}}
    )
    found = _names(a, b)
    assert "different base learning rate" not in found, found
    assert set(found) == {"different warmups"}, found
    f = found["different warmups"]
    assert "A's lr rises to 0.001 over 4 steps (from 0.00025)" in f.evidence, f.evidence
    assert "B's over 2 steps (from 0.0005)" in f.evidence
    assert "total_iters=1" in f.fixes[0] or "LinearLR(opt, start_factor=0.5" in f.fixes[0]
    # the same warmup on both sides names nothing
    c = with_lrs(record("tf", losses=[1.0] * 8, script=KERAS), torch_lrs)
    assert not [n for n in _names(a, c) if "lr" in n or "warmup" in n or "learning" in n]


def test_per_epoch_schedules_over_epochs_of_different_lengths_are_one_schedule():
    """Both halve the lr per epoch, A's epochs 3 steps long (a smaller batch), B's 2: a second
    finding 'different lr schedules: StepLR -> the schedule B follows' though both step per epoch
    and agree epoch by epoch."""
    a = with_lrs(record("torch", losses=[1.0] * 9, script=TORCH), _halving(9, per_epoch=3))
    a = edit_steps(a, lambda k, s: {"epoch": 1 + k // 3})
    a.config = a.config.edited({"scheduler": {"type": "StepLR", "step_lines": [4]}})
    b = with_lrs(record("tf", losses=[1.0] * 6, script=KERAS), _halving(6))
    b.config = b.config.edited({"optimizer": {"type": "SGD", "learning_rate": 1e-3}})
    assert not [n for n in _names(a, b) if "schedule" in n], _names(a, b)
    # an epoch's lr that differs is still named, at its epoch's first step
    c = with_lrs(
        record("tf", losses=[1.0] * 6, script=KERAS), [1e-3, 1e-3, 2.5e-4, 2.5e-4, 6.25e-5, 6.25e-5]
    )
    c.config = c.config.edited({"optimizer": {"type": "SGD", "learning_rate": 1e-3}})
    f = _names(a, c)["different lr schedules"]
    assert "epoch 2" in f.evidence and "0.5x in A" in f.evidence and "0.25x in B" in f.evidence


SET_EPOCH = """\
sampler = DistributedSampler(ds, shuffle=True)
for epoch in range(3):
    if not args.no_set_epoch:
        sampler.set_epoch(epoch)
"""


def test_a_forgotten_set_epoch_quotes_the_call_that_did_not_move_the_sampler():
    """The script's set_epoch line sat in a branch that did not run: the fix quoted that very line
    and said to call set_epoch, as if the script had no such call. The recorder's sampler epochs
    are the evidence: the training sampler's epoch stayed 0 in every epoch."""
    shuffled = {"type": "DistributedSampler", "shuffle": True}
    other = record("torch", script=SET_EPOCH, config={"sampler": shuffled | {"epochs": [0, 1]}})
    same = record("torch", script=SET_EPOCH, config={"sampler": shuffled | {"epochs": [0, 0]}})
    same = with_rows(same, lambda s, r: [f"{(s - 1) % 2}"])  # epoch 2 feeds epoch 1's rows
    (f,) = [f for f in diagnose(other, same) if f.name.startswith("set_epoch forgotten")]
    assert "the sampler's epoch stayed 0 in every epoch" in f.evidence, f.evidence
    assert "torch.py:4: sampler.set_epoch(epoch) -> this call did not move" in f.fixes[0], f.fixes
    assert "every epoch, on the sampler the training DataLoader draws from" in f.fixes[0]
    # a script with no set_epoch at all is sent to its epoch loop, to add the call
    bare = record("torch", script=SET_EPOCH.replace("        sampler.set_epoch(epoch)\n", ""))
    bare = with_rows(bare, lambda s, r: [f"{(s - 1) % 2}"])
    (g,) = [f for f in diagnose(other, bare) if f.name.startswith("set_epoch forgotten")]
    assert "torch.py:2: for epoch in range(3): -> call `sampler.set_epoch(epoch)`" in g.fixes[0]


def _momentum_pair(losses_b: list[float]):
    """torch SGD(momentum=0.9) under a StepLR, Keras SGD(momentum=0.9) under a staircase decay,
    the same lrs (halved at step 5)."""
    lrs = [0.1] * 4 + [0.05] * 8
    a = with_lrs(record("torch", losses=[1.0] * 12), lrs)
    a.config = a.config.edited(
        {"optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9, "dampening": 0}}
    )
    b = with_lrs(record("tf", losses=losses_b), lrs)
    b.config = b.config.edited(
        {"optimizer": {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9}}
    )
    return a, b


def test_a_failure_only_a_convention_explains_gets_its_own_verdict_word():
    """SGD momentum under a StepLR against Keras's under a staircase decay: the loss trajectory
    FAILed and the only finding said it was a convention of the frameworks, 'not a failure'. The
    verdict now says CONVENTION with the measured effect on the loss; a loss that parts before the
    lr changes, or beside a difference a line can change, stays a FAIL."""
    from dualtrain.audit.checks import run_checks
    from dualtrain.audit.compare import AuditComparison

    def compared(a, b):
        return AuditComparison(a, b, run_checks(a, b), diagnose(a, b))

    late = compared(*_momentum_pair([1.0] * 8 + [1.3] * 4))  # parts after step 5
    assert not late.passed and late.word == "CONVENTION", late.verdict
    assert late.verdict.startswith("verdict: CONVENTION (7/8 checks; loss trajectory: the mean"), (
        late.verdict
    )
    assert "explained by SGD momentum convention under a changing lr (from step 5)" in late.verdict
    early = compared(*_momentum_pair([1.3] * 12))  # parts at step 1, before any lr change
    assert early.word == "FAIL" and early.verdict.startswith("verdict: FAIL"), early.verdict
    a, b = _momentum_pair([1.0] * 8 + [1.3] * 4)
    b.config = b.config.edited(
        {"optimizer": {**b.config.json["optimizer"], "momentum": 0.5}}
    )  # a setting a line changes
    assert compared(a, b).word == "FAIL"
