"""Early stopping and the best weights (train.early_stopping, train.keep_best; issue 20): on a spec
built to stop, both backends stop after the same step (world 3: the chief decides, every process
follows, none waits in a collective), a run resumed before the stop stops there too, and a backend
whose decision breaks the rule is named by compare's early_stopping check."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.parity import compare_records
from dualtrain.parity.checks import check_early_stopping
from dualtrain.records.record import WEIGHTS_BEST, read_run
from dualtrain.runtime import checkpoint
from testkit.cli import run_cli
from tools.mutants import hook

# fp64 (the decisions of the fp64 pair must be identical), 6,000 samples at batch 128 over 3
# replicas, an evaluation every 10 steps on 1,000 test samples: the test loss stops improving by
# more than 0.02 within the 3 epochs (141 steps)
STOPS = (
    "data.train_limit=6000",
    "data.test_limit=1000",
    "train.epochs=3",
    "train.eval_every=10",
    "distribution.world_size=3",
    "precision.dtype=fp64",
    "train.early_stopping={metric: loss, patience: 2, min_delta: 0.02}",
    "train.keep_best=true",
)


def test_both_backends_stop_after_the_same_step(runs):
    a, b = read_run(runs("torch", *STOPS)), read_run(runs("tf", *STOPS))
    sa, sb = a.summary["early_stopping"], b.summary["early_stopping"]
    print(sa, sb)
    assert sa["stopped_at"] is not None and sa["stopped_at"] < 141  # it did stop early
    assert a.summary["steps"] == sa["stopped_at"] == sb["stopped_at"] == b.summary["steps"]
    assert sa["best_step"] == sb["best_step"] < sa["stopped_at"]
    check = check_early_stopping(a, b, exact=True)
    assert check.passed, check.detail
    cmp = compare_records(a, b)
    assert cmp.passed, cmp.diagnosis.summary()
    for run in (a, b):  # the best evaluation's weights were kept
        assert (run.path / WEIGHTS_BEST).is_file()
        assert [r["step"] for r in run.eval if r.get("stop")] == [sa["stopped_at"]]


@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=pytest.mark.slow) for b in ("torch", "tf")]
)
def test_a_run_resumed_before_the_stop_stops_there_too(runs, backend):
    sets = (*STOPS, "train.checkpoint_every=20", "train.keep_checkpoints=10")
    full = runs(backend, *sets)
    stop = read_run(full).summary["early_stopping"]["stopped_at"]
    again = runs.resume_from(backend, checkpoint.step_dir(full, 20), *sets)
    assert read_run(again).summary["early_stopping"] == read_run(full).summary["early_stopping"]
    assert read_run(again).summary["steps"] == stop
    for name in ("weights_final.npz", WEIGHTS_BEST):
        wa, wb = load_weights(full / name), load_weights(again / name)
        assert all(np.array_equal(wa[k], wb[k]) for k in wa), name


@pytest.mark.parametrize("backend", ["tf", pytest.param("torch", marks=pytest.mark.slow)])
def test_a_late_stop_is_named(runs, backend):
    env = hook("early_stop_late", backend=backend)
    a = read_run(runs("torch", *STOPS, env=env if backend == "torch" else None))
    b = read_run(runs("tf", *STOPS, env=env if backend == "tf" else None))
    check = check_early_stopping(a, b, exact=False)  # even where rounding may part decisions
    print(check.detail)
    assert not check.passed
    assert f"{backend} breaks the rule after step" in check.detail


@pytest.mark.slow
def test_the_best_weights_export(runs, tmp_path):
    run = runs("torch", *STOPS)
    out = tmp_path / "best"
    proc = run_cli("export", str(run), "--format", "torch", "--weights", "best", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "export.json").read_text())["weights"] == WEIGHTS_BEST
    # a run without keep_best has no best weights: one line, nothing written
    plain = runs("torch", *STOPS[:-1])
    proc = run_cli(
        "export", str(plain), "--format", "torch", "--weights", "best", "--out", str(tmp_path / "x")
    )
    assert proc.returncode == 2 and "--weights best needs a run with train.keep_best" in proc.stderr
    assert not (tmp_path / "x").exists()
