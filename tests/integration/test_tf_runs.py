"""End-to-end tf runs: run-directory contract, sharding plan, gradient averaging (real
processes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualtrain.core.plan import ShardPlan
from dualtrain.core.weights import initial_weights, load_weights, weights_digest
from dualtrain.spec import from_dict
from testkit.tf_runs import small_spec

# 64 samples, global batch 7: steps of 7 ids split 4/3 (W=2) or 3/2/2 (W=3), and a last partial
# batch of 1 id (replicas 1.. get nothing). Two epochs: a fresh permutation in epoch 2.
UNEVEN = dict(train={"epochs": 2, "log_every": 4}, debug={"dump_grads": [1]})
CASES = {
    "w1": small_spec(distribution={"world_size": 1}, **UNEVEN),
    "w2": small_spec(distribution={"world_size": 2}, **UNEVEN),
    "w3": small_spec(distribution={"world_size": 3}, **UNEVEN),
    "w2mw": small_spec(distribution={"world_size": 2}, tf={"strategy": "multi_worker"}, **UNEVEN),
}
TRAIN_KEYS = {
    "kind",
    "step",
    "epoch",
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "skipped",
    "samples",
    "samples_per_s",
}
EVAL_KEYS = {"kind", "step", "epoch", "loss", "accuracy", "count"}


def relative_grad_error(g: dict, ref: dict) -> dict[str, float]:
    assert set(g) == set(ref)
    return {k: float(np.max(np.abs(g[k] - ref[k])) / np.max(np.abs(ref[k]))) for k in ref}


@pytest.mark.parametrize("key", ["w2", "w2mw"])
def test_run_directory_contract(cached_run, key):
    spec_in = CASES[key]
    run = cached_run(key, spec_in)
    rec = run.record
    out = run.out
    for name in (
        "spec.yaml",
        "metrics.jsonl",
        "shards.jsonl",
        "summary.json",
        "weights_init.npz",
        "weights_final.npz",
        "launch.json",
        "grads_step1.npz",
    ):
        assert (out / name).is_file(), name
    spec = from_dict(rec.spec)
    plan = ShardPlan.from_spec(spec, 64)
    steps = 2 * plan.steps_per_epoch
    s = rec.summary
    assert s["backend"] == "tf" and s["world_size"] == 2 and s["precision"] == "fp32"
    assert s["steps"] == steps and s["samples"] == 2 * 64 and s["skipped_steps"] == 0
    assert s["test_count"] == 50 and 0.0 <= s["test_accuracy"] <= 1.0 and s["test_loss"] > 0
    assert s["tf_strategy"] == spec_in["tf"]["strategy"]
    assert s["tf_processes"] == (2 if key == "w2mw" else 1)
    assert s["versions"]["tensorflow"] and s["versions"]["keras"]
    assert s["train_samples_per_s"] > 0 and s["wall_s"] >= s["train_wall_s"] > 0
    final = load_weights(out / "weights_final.npz")
    init = load_weights(out / "weights_init.npz")
    assert s["weights_final_digest"] == weights_digest(final)
    assert weights_digest(init) == weights_digest(initial_weights(spec.model, spec.seed))
    assert {k: v.shape for k, v in final.items()} == {k: v.shape for k, v in init.items()}
    assert all(np.all(np.isfinite(v)) for v in final.values())
    assert any(not np.array_equal(final[k], init[k]) for k in init)  # it trained
    assert [r["step"] for r in rec.train] == list(range(1, steps + 1))
    for r in rec.train:
        assert set(r) == TRAIN_KEYS, r
        assert r["loss_scale"] == 1.0 and r["skipped"] is False and r["lr"] == 0.05
        assert np.isfinite(r["loss"]) and r["grad_norm"] > 0
    assert [r["samples"] for r in rec.train[: plan.steps_per_epoch]] == [7] * 9 + [1]
    assert [(e["step"], e["epoch"]) for e in rec.eval] == [(10, 1), (20, 2)]
    for e in rec.eval:
        assert set(e) == EVAL_KEYS and e["count"] == 50
    assert rec.eval[-1]["accuracy"] == s["test_accuracy"]
    launch = json.loads((out / "launch.json").read_text())
    assert launch["module"] == "dualtrain.backends.tf"
    assert [w["worker"] for w in launch["workers"]] == ([0, 1] if key == "w2mw" else [0])
    assert "[tf] done:" in run.proc.stdout


@pytest.mark.parametrize("key", ["w1", "w2", "w3", "w2mw"])
def test_shards_follow_the_plan(cached_run, key):
    rec = cached_run(key, CASES[key]).record
    spec = from_dict(rec.spec)
    plan = ShardPlan.from_spec(spec, 64)
    world = spec.distribution.world_size
    expected = {}
    for epoch in range(2):
        for k, step in enumerate(plan.digests(epoch)):
            for replica, (digest, count) in enumerate(step):
                expected[(epoch * plan.steps_per_epoch + k + 1, replica)] = (
                    epoch + 1,
                    digest,
                    count,
                )
    got = {(r["step"], r["replica"]): (r["epoch"], r["digest"], r["count"]) for r in rec.shards}
    assert len(rec.shards) == len(got) == 2 * plan.steps_per_epoch * world
    assert got == expected
    # The partial last batch really leaves replicas empty when W > 1.
    last = [got[(plan.steps_per_epoch, r)][2] for r in range(world)]
    assert last == [1] + [0] * (world - 1)


@pytest.mark.parametrize("key", ["w2", "w3", "w2mw"])
def test_uneven_shards_give_the_global_mean_gradient(cached_run, key):
    ref = cached_run("w1", CASES["w1"]).grads(1)
    got = cached_run(key, CASES[key]).grads(1)
    err = relative_grad_error(got, ref)
    assert max(err.values()) <= 1e-6, err
