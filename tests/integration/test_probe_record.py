"""The fp64 run that records compare's probe states (dualtrain.runtime.probes) trains bit for bit as
without them: at each probe step it takes the reference step from the rounded state, then restores
its own state exactly before taking the step itself."""

from __future__ import annotations

import json

import numpy as np

from dualtrain.driver.runs import start_run
from dualtrain.runtime import probes
from dualtrain.spec import Backend, load_spec
from testkit.cli import ROOT


def test_recording_probes_leaves_the_fp64_run_bit_identical(tmp_path):
    spec = load_spec(
        ROOT / "configs" / "mnist_mlp.yaml",
        [
            "data.train_limit=700",
            "data.test_limit=200",
            "train.epochs=2",
            "precision.dtype=fp64",
            "optimizer.name=adam",
            "optimizer.lr=0.001",
            "distribution.world_size=2",
            "train.log_every=1000",
        ],
    )
    plain, _ = start_run(spec, Backend.TORCH, tmp_path / "plain")
    rec, _ = start_run(spec, Backend.TORCH, tmp_path / "rec", probe=probes.RECORD)
    s_plain = json.loads((plain / "summary.json").read_text())
    s_rec = json.loads((rec / "summary.json").read_text())
    assert s_rec["weights_final_digest"] == s_plain["weights_final_digest"]
    assert (plain / "metrics.jsonl").read_text().count("loss") == (
        rec / "metrics.jsonl"
    ).read_text().count("loss")
    losses = [json.loads(x)["loss"] for x in (plain / "metrics.jsonl").read_text().splitlines()]
    assert losses == [
        json.loads(x)["loss"] for x in (rec / "metrics.jsonl").read_text().splitlines()
    ]
    rows = probes.read_index(rec)
    assert [r["step"] for r in rows] == probes.probe_steps(s_plain["steps"])
    assert s_rec["probes"] == {"mode": "record", "steps": len(rows), "source": ""}
    # the recorded state is the run's own (float64) state before the step: step 1's is the init
    first = probes.load(rec, 1)
    init = np.load(rec / "weights_init.npz")
    assert all(np.array_equal(first["pre"][k], init[k].astype(np.float64)) for k in init.files)
    assert rows[0]["applied"] == 0 and not first.get("slot")
