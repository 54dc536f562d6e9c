"""The average of the weights (train.ema, issue 20): the fp64 pair agrees on the averaged weights
to the reference bound (compare's weight checks judge them beside the final ones), evaluating
with them changes the evaluation and nothing of the training, a resumed run carries the average
bit for bit, and the averaged weights export and load without dualtrain."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.parity.checks import Reference, check_reference_weights
from dualtrain.records.record import WEIGHTS_EMA, read_run
from dualtrain.runtime import checkpoint
from testkit.cli import run_cli
from testkit.shared import run_outputs, run_without_dualtrain
from tools.mutants import hook

from .test_model_pairs import LOADERS

EMA = (
    "data.train_limit=3000",
    "data.test_limit=500",
    "train.epochs=2",
    "distribution.world_size=2",
    "precision.dtype=fp64",
    "optimizer.momentum=0.9",
    "train.ema={decay: 0.9, every: 2, start: 5}",
)


def test_the_fp64_pair_agrees_on_the_averaged_weights(runs):
    a, b = runs("torch", *EMA), runs("tf", *EMA)
    check = check_reference_weights(Reference(read_run(a), read_run(b)))
    print(check.detail)
    assert check.passed, check.detail
    averaged, final = load_weights(a / WEIGHTS_EMA), load_weights(a / "weights_final.npz")
    assert set(averaged) == set(final)
    moved = max(float(np.abs(averaged[k] - final[k]).max()) for k in final)
    assert moved > 1e-3  # an average, not a copy of the final weights
    # batchnorm-free model: every array is a parameter; the averaged file equals on both sides
    other = load_weights(b / WEIGHTS_EMA)
    assert max(float(np.abs(averaged[k] - other[k]).max()) for k in averaged) < 1e-12


def test_evaluating_the_average_leaves_training_alone(runs):
    live = read_run(runs("torch", *EMA))
    averaged = read_run(
        runs("torch", *EMA[:-1], "train.ema={decay: 0.9, every: 2, start: 5, evaluate: true}")
    )
    assert [r["loss"] for r in live.train] == [r["loss"] for r in averaged.train]
    wa = load_weights(live.path / "weights_final.npz")
    wb = load_weights(averaged.path / "weights_final.npz")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert [r["loss"] for r in live.eval] != [r["loss"] for r in averaged.eval]


@pytest.mark.slow  # the default suite keeps the average's fp64 pair and its swapped-decay mutant
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_resumed_run_carries_the_average(runs, backend):
    sets = (*EMA, "train.checkpoint_every=10", "train.keep_checkpoints=5")
    full = runs(backend, *sets)
    again = runs.resume_from(backend, checkpoint.step_dir(full, 30), *sets)
    for name in ("weights_final.npz", WEIGHTS_EMA):
        wa, wb = load_weights(full / name), load_weights(again / name)
        assert all(np.array_equal(wa[k], wb[k]) for k in wa), name


@pytest.mark.slow
@pytest.mark.sweep  # CI's time (docs/testing.md)
def test_the_averaged_weights_export(runs, tmp_path):
    run = runs("tf", *EMA)
    folder = tmp_path / "ema"
    proc = run_cli(
        "export", str(run), "--format", "torch", "--weights", "ema", "--out", str(folder)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((folder / "export.json").read_text())["weights"] == WEIGHTS_EMA
    expected, (x,) = run_outputs(run, "tf", 50, tmp_path, weights=WEIGHTS_EMA)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "exported.npy"
    proc = run_without_dualtrain(
        LOADERS["torch"], str(folder), str(tmp_path / "x.npy"), str(out), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    final, _ = run_outputs(run, "tf", 50, tmp_path, weights="weights_final.npz")
    # the export computes in float32 (as the other exports: 1e-4 on logits of ~10)
    assert float(np.abs(got - expected).max()) < 1e-4
    assert float(np.abs(got - final).max()) > 1e-2  # the averaged weights, not the final ones


@pytest.mark.parametrize("backend", ["tf", pytest.param("torch", marks=pytest.mark.slow)])
def test_a_swapped_decay_fails_the_fp64_pair(runs, backend):
    env = hook("ema_decay_swapped", backend=backend)
    a = read_run(runs("torch", *EMA, env=env if backend == "torch" else None))
    b = read_run(runs("tf", *EMA, env=env if backend == "tf" else None))
    assert (a if backend == "torch" else b).summary["test_hook"].endswith("ema_decay_swapped")
    check = check_reference_weights(Reference(a, b))
    print(check.detail)
    assert not check.passed and "ema/" in check.detail
    # the training itself is untouched: only the averaged weights part
    wa, wb = load_weights(a.path / "weights_final.npz"), load_weights(b.path / "weights_final.npz")
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-12
