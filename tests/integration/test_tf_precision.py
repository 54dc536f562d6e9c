"""Mixed precision: fp16 dynamic loss scaling decided on the all-reduced gradient; bf16 runs."""

from __future__ import annotations

import math

from dualtrain.records.record import as_float
from testkit.tf_runs import small_spec, tf_run


def test_fp16_overflow_on_one_replica_skips_the_step_everywhere(tmp_path):
    # One fixed batch (no shuffle, batch = train set) every step, so a skipped step leaves the
    # weights exactly where they were: the evaluation after step 2 (every replica scores its slice
    # with its own copy of the weights) must equal the one after step 1. Only replica 1 overflows at
    # step 2.
    spec = small_spec(
        data={"train_limit": 8, "batch_size": 8, "shuffle": False, "test_limit": 40},
        precision={"dtype": "fp16"},
        distribution={"world_size": 2},
        train={"epochs": 4, "log_every": 1, "eval_every": 1},
        debug={"nonfinite_grad": [[2, 1]]},
    )
    rec = tf_run(tmp_path, spec).record
    train = rec.train
    assert [r["skipped"] for r in train] == [False, True, False, False]
    assert [r["loss_scale"] for r in train] == [65536.0, 65536.0, 32768.0, 32768.0]
    assert not math.isfinite(as_float(train[1]["grad_norm"]))
    assert all(math.isfinite(as_float(r["grad_norm"])) for r in (train[0], train[2], train[3]))
    assert rec.summary["skipped_steps"] == 1 and rec.summary["precision"] == "fp16"
    evals = {e["step"]: (e["loss"], e["accuracy"]) for e in rec.eval}
    assert evals[2] == evals[1], evals  # step 2 changed no replica's weights
    assert evals[3] != evals[2], evals  # step 3 was applied again
    # Same batch, same weights: the training loss of step 3 repeats step 2's, and differs from 1's.
    assert train[2]["loss"] == train[1]["loss"] != train[0]["loss"]


def test_fp16_scale_grows_after_growth_interval(tmp_path):
    spec = small_spec(
        data={"train_limit": 32, "batch_size": 8, "test_limit": 20},
        precision={
            "dtype": "fp16",
            "loss_scale": {"init": 1024.0, "growth_interval": 2, "growth_factor": 4.0},
        },
        distribution={"world_size": 2},
        train={"epochs": 1, "log_every": 2},
    )
    rec = tf_run(tmp_path, spec).record
    assert [r["loss_scale"] for r in rec.train] == [1024.0, 1024.0, 4096.0, 4096.0]
    assert not any(r["skipped"] for r in rec.train)


def test_bf16_short_run_completes(tmp_path):
    spec = small_spec(
        data={"train_limit": 256, "batch_size": 32, "test_limit": 100},
        precision={"dtype": "bf16"},
        distribution={"world_size": 2},
        train={"epochs": 1, "log_every": 4},
    )
    rec = tf_run(tmp_path, spec).record
    assert rec.summary["precision"] == "bf16" and rec.summary["steps"] == 8
    assert all(r["loss_scale"] == 1.0 and not r["skipped"] for r in rec.train)
    losses = [r["loss"] for r in rec.train]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert rec.summary["test_count"] == 100 and math.isfinite(rec.summary["test_loss"])
