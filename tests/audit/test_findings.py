"""Findings the fifth round of unseen scripts got wrong, on records written in the test: a
scheduler's own first lr, replicas out of step, a sampler that does not shuffle or shuffles with
another seed, another split of the data, and the lines each fix quotes."""

from __future__ import annotations

import numpy as np

from dualtrain.audit.checks import run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.replicas import check_replicas
from tests.audit.records import edit_rows, edit_steps, record, with_lrs, with_rows

TORCH = """\
p.add_argument("--opt", default="sgd")
p.add_argument("--clip", type=float)
ds, val = random_split(ds, [640, 128], generator=g)
sampler = DistributedSampler(ds, shuffle=not a.no_shuffle, seed=a.seed)
class Net(nn.Module):
opt = torch.optim.SGD(model.parameters(), lr=0.05)
if a.sched == "seq":
    sched = SequentialLR(opt, [LinearLR(opt, 0.1), CosineAnnealingLR(opt, 10)], [5])
"""


def _torch(**config) -> object:
    return record("torch", script=TORCH, config=config)


def test_a_schedulers_first_lr_is_a_schedule_not_a_base_lr():
    """LinearLR(start_factor=0.1) makes step 1's lr 0.005 of an SGD made with 0.05: it was named
    'different base learning rate' with lr=0.05 to write into the optimizer line, and the run
    without a scheduler was sent to a SequentialLR line of a branch it never ran."""
    plain = _torch(optimizer={"type": "SGD", "lr": 0.05})
    edit_steps(plain, lambda k, s: {"lr": 0.05})
    warm = _torch(
        optimizer={"type": "SGD", "lr": 0.005, "initial_lr": 0.05},
        scheduler={"type": "SequentialLR"},
    )
    edit_steps(warm, lambda k, s: {"lr": 0.005})
    names = {f.name: f for f in diagnose(plain, warm)}
    assert "different base learning rate" not in names, list(names)
    f = names["different lr schedules"]
    assert "both optimizers are made with lr 0.05" in f.evidence
    assert "B's SequentialLR sets step 1's lr to 0.1x of it" in f.evidence
    assert "torch.py:6: opt = torch.optim.SGD(" in f.fixes[0], f.fixes  # A: no scheduler ran
    assert "torch.py:8: sched = SequentialLR(" in f.fixes[1], f.fixes


def test_quoted_lines_skip_argparse_options_and_scheduler_names():
    run = _torch()
    assert run.line_of("opt") == "torch.py:6: opt = torch.optim.SGD(model.parameters(), lr=0.05)"
    assert run.line_of("--clip") == 'torch.py:2: p.add_argument("--clip", type=float)'  # only there
    other = _torch()
    other.weights_init = other.weights_final = {"w": other.weights_init["w"], "b": 0}
    (f,) = [f for f in diagnose(run, other) if f.name == "different models"]
    assert "torch.py:5: class Net(nn.Module):" in f.fixes[0], f.fixes  # not SequentialLR(


def _swapped(run):
    """``run`` with epoch 1's two steps in the other order (the same samples)."""
    return with_rows(run, lambda s, r: [f"{(3 - s if s < 3 else s):08x}{r:08x}"])


def test_two_samplers_options_are_quoted_and_no_shuffling_is_not_set_epoch():
    seeded = {"type": "DistributedSampler", "shuffle": True, "seed": 0}
    a = _torch(sampler=seeded)
    b = _swapped(_torch(sampler=seeded | {"seed": 7}))
    (f,) = [f for f in diagnose(a, b) if f.name == "shuffle seeds"]
    assert "B's DistributedSampler(shuffle=True, seed=7)" in f.evidence
    assert f.fixes[0].endswith("-> DistributedSampler(shuffle=True, seed=7) as the other script")
    assert "torch.py:4: sampler = DistributedSampler(" in f.fixes[0]
    # shuffle=False: epoch 2 repeats epoch 1; the script calls set_epoch, which changes nothing
    still = with_rows(_torch(sampler=seeded | {"shuffle": False}), lambda s, r: [f"{(s - 1) % 2}"])
    found = {f.name: f for f in diagnose(a, still)}
    assert "set_epoch forgotten (every epoch the same order)" not in found, list(found)
    f = found["no shuffling (every epoch the same order)"]
    assert "torch.py:4: sampler = DistributedSampler(" in f.fixes[0]
    assert "shuffle=True (this DistributedSampler does not shuffle)" in f.fixes[0]


def test_different_data_quotes_the_split():
    other = with_rows(_torch(), lambda s, r: [f"other{s}-{i}" for i in range(8)])  # 8 rows a step
    (f,) = [f for f in diagnose(_torch(), other) if f.name == "different data"]
    assert "torch.py:3: ds, val = random_split(" in f.fixes[0], f.fixes


def test_replicas_out_of_step_in_a_record():
    ddp = record("torch", world=2, config={"replicas": {"ranks": 2, "arrays": 1}})
    apart = record(
        "torch",
        world=2,
        config={
            "replicas": {"ranks": 2, "arrays": 1, "final": {"1": ["w"]}, "final_arrays": {"1": 1}}
        },
    )
    edit_rows(ddp, lambda s, r, row: {"grad_norm": 1.0})
    edit_rows(apart, lambda s, r, row: {"grad_norm": 1.0 + (r if s >= 3 else 0) * 1e-3})
    assert check_replicas(ddp, ddp).status == "PASS"
    check = check_replicas(ddp, apart)
    assert check.status == "FAIL", check
    assert check.detail == (
        "B's replicas end with different weights; B's replicas step with different gradients "
        "(step 3)"
    )
    assert "replicas in step" in [c.name for c in run_checks(ddp, apart) if c.status == "FAIL"]
    (f,) = [f for f in diagnose(ddp, apart) if f.name.startswith("replicas out of step")]
    assert f.step == 3 and "step 3's gradient norms rank 0: 1, rank 1: 1.001" in f.evidence
    assert "at the end, rank 1's parameters differ from rank 0's in 1 of 1 arrays" in f.evidence
    old = record("torch", world=2)  # recorded before the digests: not judged, not a failure
    assert check_replicas(old, ddp).status == "NOT JUDGED"
    assert check_replicas(record("tf", world=2), ddp).status == "PASS"  # mirrored variables


def test_a_keras_sum_reduced_loss_is_named_at_the_global_batch():
    """Keras reports a reduction="sum" loss over the global batch (64x a mean of 2 x 32 rows in
    the fifth round): only the local batch's ratio was looked for, and nothing was named."""
    keras_sum = record("tf", world=2, losses=[8.0] * 4, script='loss = Loss(reduction="sum")\n')
    found = [f for f in diagnose(record("torch", world=2), keras_sum) if "sum vs mean" in f.name]
    (f,) = found
    assert "B's loss is 8.0x A's, about the global batch (8 rows)" in f.evidence
    assert 'tf.py:1: loss = Loss(reduction="sum")' in f.fixes[0]
    torch_sum = record("torch", world=2, losses=[4.0] * 4)  # a DDP loop's: its local batch
    (f,) = [f for f in diagnose(record("torch", world=2), torch_sum) if "sum vs mean" in f.name]
    assert "about the local batch (4 rows)" in f.evidence


def test_keras_only_optimizer_options_are_named_against_torch():
    """use_ema, gradient_accumulation_steps and exclude_from_weight_decay have no torch option
    the recorder reads: a Keras AdamW with them PASSed against a torch AdamW without."""
    torch_run = record("torch", config={"optimizer": {"type": "AdamW", "weight_decay": 0.01}})
    keras_opt = {"type": "AdamW", "weight_decay": 0.01, "use_ema": True, "ema_momentum": 0.99}
    keras_opt |= {"gradient_accumulation_steps": 4, "no_decay": ["fc.bias"]}
    for k in ("epsilon", "beta_1", "beta_2"):
        keras_opt[k] = {"epsilon": 1e-8, "beta_1": 0.9, "beta_2": 0.999}[k]
    torch_run.config = torch_run.config.edited(
        {"optimizer": {**torch_run.config.json["optimizer"], "eps": 1e-8, "betas": [0.9, 0.999]}}
    )
    keras_run = record("tf", config={"optimizer": keras_opt})
    found = {f.name: f for f in diagnose(torch_run, keras_run)}
    f = found["optimizer conventions (momentum, epsilon, weight decay)"]
    ema = found["different moving average of the weights (EMA)"]  # (test_findings_schedules)
    assert "B writes its optimizer's moving average (use_ema=True, ema_momentum=0.99)" in (
        ema.evidence
    )
    assert "gradient_accumulation_steps=4 updates once every 4 batches" in f.evidence
    assert "exclude_from_weight_decay leaves out 1 variable(s) (fc.bias)" in f.evidence
    plain = {k: v for k, v in keras_opt.items() if k not in ("use_ema", "no_decay")}
    plain["gradient_accumulation_steps"] = None
    assert not [f for f in diagnose(torch_run, record("tf", config={"optimizer": plain}))]


def test_a_loss_all_reduced_for_the_log_and_gradients_summed_by_hand_quote_the_all_reduce():
    script = "dist.all_reduce(logged)\nloss = crit(out, y)\nrec.step(logged)\n"
    summed = record("torch", world=2, losses=[2.0] * 4, script=script)
    (f,) = [f for f in diagnose(record("torch", world=2), summed) if "summed over" in f.name]
    assert f.name == "loss recorded summed over the replicas" and "2.00x" in f.evidence
    assert "torch.py:1: dist.all_reduce(logged)" in f.fixes[0]
    by_hand = "loss = crit(out, y)\nfor p in model.parameters():\n    dist.all_reduce(p.grad)\n"
    twice = record("torch", world=2, grad_norm=2.0, script=by_hand, config={"ddp": False})
    (f,) = [f for f in diagnose(record("torch", world=2), twice) if "global batch" in f.name]
    assert "torch.py:3: dist.all_reduce(p.grad) -> divide the all-reduced gradients" in f.fixes[0]


def _epochs(run, epochs: list[int], samples: list[int]):
    """``run`` with its steps' epochs and row counts set."""
    run.steps = run.steps[: len(epochs)]
    return edit_steps(run, lambda k, s: {"epoch": epochs[k], "samples": samples[k]})


def test_drop_remainder_needs_the_shorter_epoch_to_end_on_a_whole_batch():
    """Another validation_split: both epochs end on a partial batch of their own, one a step
    later; it was named drop_remainder, with a `.batch` line to change the script did not have."""
    partial = _epochs(record("tf", losses=[1.0] * 6), [1, 1, 1, 2, 2, 2], [8, 8, 4, 8, 8, 4])
    other = _epochs(record("tf", losses=[1.0] * 4), [1, 1, 2, 2], [8, 6, 8, 6])
    assert "drop_remainder" not in [f.name for f in diagnose(partial, other)]
    dropped = _epochs(record("tf", losses=[1.0] * 4), [1, 1, 2, 2], [8, 8, 8, 8])
    assert "drop_remainder" in [f.name for f in diagnose(partial, dropped)]


def test_an_epoch_left_early_is_not_different_data():
    """A `break` after 2 of 3 batches (the same rows until it): it was named 'different data'
    with the split to change; a last partial batch dropped stays drop_remainder."""
    full = _epochs(record("torch", losses=[1.0] * 6), [1, 1, 1, 2, 2, 2], [8] * 6)
    script = "for i, (x, y) in enumerate(loader):\n    if i == 2:\n        break\n"
    early = record("torch", losses=[1.0] * 5, script=script)
    early = _epochs(early, [1, 1, 2, 2, 2], [8] * 5)
    rows = {1: 1, 2: 2, 3: 4, 4: 5, 5: 6}  # its steps' rows: full's 1, 2, then epoch 2's
    with_rows(early, lambda s, r: [f"{rows[s]:08x}{r:08x}"])
    found = {f.name: f for f in diagnose(full, early)}
    assert "different data" not in found, list(found)
    f = found["an epoch left early"]
    assert f.step == 3 and "B leaves epoch 1 after 2 steps, the other run after 3" in f.evidence
    assert "torch.py:3: break -> every batch of the epoch" in f.fixes[0], f.fixes
    partial = _epochs(record("torch", losses=[1.0] * 6), [1, 1, 1, 2, 2, 2], [8, 8, 4] * 2)
    found = {f.name for f in diagnose(partial, early)}
    assert "drop_remainder" in found and "an epoch left early" not in found, found


def _cosine(n: int, warmup: int, dtype) -> list[float]:
    """A warmup from 0 to 1e-3, then a cosine to 0, computed in ``dtype`` (Keras: float32)."""
    peak, out = dtype(1e-3), []
    for step in range(n):
        if step < warmup:
            out.append(peak * dtype(step) / dtype(warmup))
        else:
            t = dtype(step - warmup) / dtype(n - warmup)
            out.append(peak * dtype(0.5) * (dtype(1) + np.cos(dtype(np.pi) * t)))
    return out


def test_a_float32_cosine_passes_and_a_warmup_from_zero_is_named():
    """Keras computes CosineDecay in float32: near its end the lr is off by more than 1e-6 of
    itself (a false lr FAIL on a matching pair); a warmup from lr 0 was never named (the
    schedules were compared relative to step 1's lr); it is now named as the warmups that part."""
    torch_run = with_lrs(record("torch", losses=[1.0] * 12), _cosine(12, 4, np.float64))
    keras_run = with_lrs(record("tf", losses=[1.0] * 12), _cosine(12, 4, np.float32))
    last = torch_run.steps[-1].lr, keras_run.steps[-1].lr
    assert abs(last[0] - last[1]) > 1e-6 * max(last)  # what the relative tolerance refused
    checks = {c.name: c for c in run_checks(torch_run, keras_run)}
    assert checks["learning rate"].status == "PASS", checks["learning rate"]
    assert not [f for f in diagnose(torch_run, keras_run) if "lr" in f.name]
    short = with_lrs(record("tf", losses=[1.0] * 12), _cosine(12, 2, np.float32))
    assert {c.name: c.status for c in run_checks(torch_run, short)}["learning rate"] == "FAIL"
    (f,) = [f for f in diagnose(torch_run, short) if f.name == "different warmups"]
    assert f.evidence == "A's lr rises to 0.001 over 5 steps (from 0), B's over 3 steps (from 0)"
    assert "lambda s: min(1.0, s / 2)" in f.fixes[0], f.fixes  # LinearLR refuses a 0 start


def test_a_scheduler_stepped_first_is_not_a_base_lr():
    script = "sched.step()\nopt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
    a = with_lrs(record("torch", script=script), [0.0, 0.01, 0.02, 0.03])
    a.config = a.config.edited({"scheduler": {"type": "LambdaLR"}})
    b = with_lrs(record("torch", script=script), [0.01, 0.02, 0.03, 0.04])
    b.config = b.config.edited({"scheduler": {"type": "LambdaLR", "before_optimizer": True}})
    names = [f.name for f in diagnose(a, b)]
    assert "scheduler stepped before optimizer.step()" in names, names
    assert "different base learning rate" not in names, names


def test_two_runs_dropping_other_last_rows_shuffle_and_a_kept_partial_batch_is_no_new_data():
    """Both drop their last partial batch, shuffled otherwise: epoch 1 leaves out other rows in
    each, which was named 'different data'; a partial batch kept in one run was named 'different
    data' beside drop_remainder."""
    a = _epochs(record("torch", losses=[1.0] * 4), [1, 1, 2, 2], [8] * 4)
    b = with_rows(
        _epochs(record("torch", losses=[1.0] * 4), [1, 1, 2, 2], [8] * 4),
        lambda s, r: [f"{(3 - s if s < 3 else s):08x}{r:08x}" if s > 1 else "dropped-other-row"],
    )
    found = {f.name: f for f in diagnose(a, b)}
    assert "different data" not in found and "shuffle seeds" in found, list(found)
    assert (
        "each run drops 1 other row(s) with its last partial batch"
        in found["shuffle seeds"].evidence
    )
    kept = _epochs(record("torch", losses=[1.0] * 6), [1, 1, 1, 2, 2, 2], [8, 8, 4] * 2)
    dropped = _epochs(record("torch", losses=[1.0] * 4), [1, 1, 2, 2], [8] * 4)
    with_rows(dropped, lambda s, r: [f"{(s if s < 3 else s + 1):08x}{r:08x}"])
    names = [f.name for f in diagnose(kept, dropped)]
    assert "drop_remainder" in names and "different data" not in names, names


def test_a_torch_group_without_decay_against_a_keras_optimizer_decaying_all_is_named():
    groups = [{"weight_decay": 0.01}, {"weight_decay": 0.0}]
    torch_run = record("torch", config={"optimizer": {"type": "AdamW", "weight_decay": 0.01}})
    torch_run.config = torch_run.config.edited(
        {
            "optimizer": {
                **torch_run.config.json["optimizer"],
                "eps": 1e-7,
                "betas": [0.9, 0.999],
                "groups": groups,
            }
        }
    )
    keras_opt = {"type": "AdamW", "weight_decay": 0.01, "epsilon": 1e-7}
    keras_opt |= {"beta_1": 0.9, "beta_2": 0.999}
    (f,) = diagnose(torch_run, record("tf", config={"optimizer": keras_opt}))
    assert "torch's parameter group(s) [1] have weight_decay=0" in f.evidence, f.evidence
    keras_opt["no_decay"] = ["fc.bias"]  # both leave some out: which ones is not judged
    assert diagnose(torch_run, record("tf", config={"optimizer": keras_opt})) == []
