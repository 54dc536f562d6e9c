"""Ray Train as a launcher (issue 20): dualtrain's workers inside TorchTrainer and
TensorflowTrainer on a local Ray cluster (examples/ray/train.py) train bit for bit what
`dualtrain run` trains when it launches the same spec itself. Ray creates the torch process group
(adopted, not created twice) and a worker-only TF_CONFIG; dualtrain owns restarts and the TF
environment set before TensorFlow's import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.records.record import read_run
from testkit.cli import ROOT

pytest.importorskip("ray")

from testkit.parity_runs import MLP  # noqa: E402

SETS = (
    "train.max_steps=40",
    "train.epochs=null",
    "data.test_limit=1000",
    "distribution.threads_per_worker=1",
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", pytest.param("tf", marks=pytest.mark.sweep)])
def test_a_ray_trainer_run_is_the_dualtrain_run(runs, tmp_path, backend):
    out = tmp_path / "ray" / "run"
    args = [a for s in SETS for a in ("--set", s)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray" / "train.py"), "--backend", backend]
        + [MLP, str(out), "--world-size", "2", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    extra = ("tf.strategy=multi_worker",) if backend == "tf" else ()
    own = runs(backend, *SETS, "distribution.world_size=2", *extra)
    wa, wb = load_weights(own / "weights_final.npz"), load_weights(out / "weights_final.npz")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    said = proc.stdout + proc.stderr  # each worker names the launcher it found
    assert (
        "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment"
        if backend == "torch"
        else "TF_CONFIG task worker:1 = worker 1 of 2"
    ) in said
    if backend == "torch":
        assert read_run(out).summary["process_group_adopted"] is True
