"""How far training carries a rounding-level difference: the fp64 pair against a rounding twin.

    python -m tools.rounding_twin --config SPEC.yaml [--set KEY=VALUE ...] [--out DIR]
    python -m tools.rounding_twin --config tools/row_transformer.yaml \
        --set model.args.width=384 --set optimizer.name=sgd --set optimizer.lr=0.05 \
        --set optimizer.momentum=0.9     # pair 1.46e-10, twin 2.3e-8 (ratio 0.0064)

Runs the spec's fp64 pair (torch and tf, as ``dualtrain compare`` runs its reference pair) and the
**rounding twin**: the torch fp64 run again from the same initial weights with one element (the
first of the largest tensor) moved by one ulp, through ``model.init_from``. Prints, for the tensors
whose final weights differ most between the pair, the pair's relative difference (what
``reference_weights`` holds to 1e-10), the twin's distance from the torch run, and their ratio.

The twin measures what the training dynamics make of a difference of one rounding: a pair whose
difference stays well under the twin's differs by rounding, whatever its size; a semantic
difference (a planted defect) stands far above it. Issue 46 item 0 (the bound of the fp64 pair at
every width, depth and step count) is measured with it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from dualtrain.core.weights import load_weights, save_weights
from dualtrain.parity.readings import rel_diff


def _run(backend: str, config: str, sets: list[str], out: Path) -> Path:
    cmd = [sys.executable, "-m", "dualtrain", "run", "--backend", backend, "--config", config]
    cmd += ["--precision", "fp64", "--out", str(out), "--overwrite"]
    for s in ("train.log_every=100000", *sets):
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{backend} fp64 run failed:\n{proc.stderr[-3000:]}")
    return out


def one_ulp_away(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same weights with the first element of the largest tensor one ulp up."""
    name = max(sorted(weights), key=lambda k: weights[k].size)
    moved = weights[name].copy()
    moved.flat[0] = np.nextafter(moved.flat[0], np.inf)
    return {**weights, name: moved}


def measure(config: str, sets: list[str], out: Path, top: int = 3) -> dict[str, object]:
    torch_dir = _run("torch", config, sets, out / "fp64-torch")
    tf_dir = _run("tf", config, sets, out / "fp64-tf")
    init = out / "twin-init.npz"
    save_weights(init, one_ulp_away(load_weights(torch_dir / "weights_init.npz")))
    twin_dir = _run("torch", config, [*sets, f"model.init_from={init}"], out / "fp64-twin")
    a = load_weights(torch_dir / "weights_final.npz")
    pair = rel_diff(a, load_weights(tf_dir / "weights_final.npz"))
    twin = rel_diff(a, load_weights(twin_dir / "weights_final.npz"))
    worst = sorted(pair, key=lambda k: -pair[k])[:top]
    return {
        "sets": sets,
        "pair_worst": max(pair.values()),
        "twin_worst": max(twin.values()),
        "tensors": [
            {"tensor": k, "pair": pair[k], "twin": twin[k], "ratio": pair[k] / max(twin[k], 1e-300)}
            for k in worst
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.rounding_twin", description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, help="keep the three runs here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dualtrain-twin-") as tmp:
        result = measure(args.config, args.sets, args.out or Path(tmp))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
