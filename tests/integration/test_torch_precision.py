"""fp16 (autocast + GradScaler with the all-reduced overflow check) and bf16 on CPU."""

from __future__ import annotations

import numpy as np

from testkit.torch_runs import npz, record, torch_run


def test_fp16_huge_scale_skips_and_backs_off(tmp_path):
    out = tmp_path / "run"
    torch_run(
        out,
        "precision.dtype=fp16",
        "precision.loss_scale.init=1099511627776",  # 2**40
        "precision.loss_scale.backoff_factor=0.25",
        "data.train_limit=256",
        "train.max_steps=2",
    )
    rows = record(out).train
    assert [r["loss_scale"] for r in rows] == [2.0**40, 2.0**38]  # backoff applied after step 1
    assert [r["skipped"] for r in rows] == [True, True]  # 2**38 still overflows fp16
    assert all(np.isfinite(r["loss"]) for r in rows)
    init, final = npz(out / "weights_init.npz"), npz(out / "weights_final.npz")
    assert all(np.array_equal(init[k], final[k]) for k in init)  # skipped steps change nothing


def test_fp16_poisoned_replica_skips_on_all_ranks(tmp_path):
    # Replica 1's local gradient is inf at step 2; only the all-reduce shows it to rank 0.
    poisoned = tmp_path / "poisoned"
    torch_run(
        poisoned,
        "precision.dtype=fp16",
        "data.train_limit=512",
        "train.max_steps=3",
        "debug.nonfinite_grad=[[2,1]]",
        "debug.dump_grads=[2]",
        "optimizer.name=adamw",
        "optimizer.lr=0.001",
        "optimizer.weight_decay=0.01",
        world=2,
    )
    rows = record(poisoned).train
    assert [r["skipped"] for r in rows] == [False, True, False]
    s = rows[0]["loss_scale"]
    assert s == 65536.0 and rows[1]["loss_scale"] == s and rows[2]["loss_scale"] == s / 2
    assert not np.isfinite(float(rows[1]["grad_norm"]))
    g = npz(poisoned / "grads_step2.npz")
    assert all(np.isinf(v).all() for v in g.values())  # the chief's all-reduced copy is inf


def test_fp16_skip_leaves_weights_unchanged_world2(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    common = ("precision.dtype=fp16", "data.train_limit=512")
    torch_run(one, *common, "train.max_steps=1", world=2)
    torch_run(two, *common, "train.max_steps=2", "debug.nonfinite_grad=[[2,0]]", world=2)
    a, b = npz(one / "weights_final.npz"), npz(two / "weights_final.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [r["skipped"] for r in record(two).train] == [False, True]


def test_bf16_runs_without_scaling(tmp_path):
    out = tmp_path / "run"
    torch_run(
        out,
        "precision.dtype=bf16",
        "data.train_limit=512",
        "train.max_steps=4",
        "optimizer.clip_grad_norm=0.01",
        world=2,
    )
    rec = record(out)
    assert [r["loss_scale"] for r in rec.train] == [1.0] * 4
    assert not any(r["skipped"] for r in rec.train)
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in rec.train)
    assert rec.summary["precision"] == "bf16" and 0 < rec.summary["test_accuracy"] <= 1
    assert all(r["grad_norm"] > 0.01 for r in rec.train)  # recorded before clipping
