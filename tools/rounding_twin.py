"""How far training carries a rounding-level difference: the fp64 pair against its rounding twins.

    python -m tools.rounding_twin --config SPEC.yaml [--set KEY=VALUE ...] [--twin one|every]
    python -m tools.rounding_twin --config tools/row_transformer.yaml \
        --set model.args.width=384 --set optimizer.name=sgd --set optimizer.lr=0.05 \
        --set optimizer.momentum=0.9 --twin every   # pair 1.46e-10, twin 1.03e-10 (ratio 1.42)

Runs the spec's fp64 pair (torch and tf, as ``dualtrain compare`` runs its reference pair) and one
or more **rounding twins**: the torch fp64 run again from the same initial weights moved by one
float64 ulp, through ``model.init_from``: ``every`` element (random signs, what compare runs:
dualtrain.parity.twin) or ``one`` (the first element of the largest tensor). Prints, for the
tensors whose final weights differ most between the pair, the pair's relative difference, each
twin's distance from the torch run, and their ratio.

A twin measures what the training dynamics make of one rounding: a pair whose difference stays
within a small multiple of it differs by rounding, whatever its size; a semantic difference (a
planted defect) stands far above it. tools/reference_sweep.py runs compare itself over the sizes.
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
from dualtrain.parity.twin import every_ulp_away


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
    """The same weights in float64 with the first element of the largest tensor one ulp up."""
    name = max(sorted(weights), key=lambda k: weights[k].size)
    moved = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    moved[name] = moved[name].copy()
    moved[name].flat[0] = np.nextafter(moved[name].flat[0], np.inf)
    return moved


TWINS = {"one": one_ulp_away, "every": every_ulp_away}


def measure(
    config: str, sets: list[str], out: Path, top: int = 3, twins: tuple[str, ...] = ("one",)
) -> dict[str, object]:
    torch_dir = _run("torch", config, sets, out / "fp64-torch")
    tf_dir = _run("tf", config, sets, out / "fp64-tf")
    a = load_weights(torch_dir / "weights_final.npz")
    pair = rel_diff(a, load_weights(tf_dir / "weights_final.npz"))
    worst = sorted(pair, key=lambda k: -pair[k])[:top]
    result: dict[str, object] = {"sets": sets, "pair_worst": max(pair.values())}
    for kind in twins:
        init = out / f"twin-{kind}-init.npz"
        save_weights(init, TWINS[kind](load_weights(torch_dir / "weights_init.npz")))
        twin_dir = _run("torch", config, [*sets, f"model.init_from={init}"], out / f"twin-{kind}")
        twin = rel_diff(a, load_weights(twin_dir / "weights_final.npz"))
        result[f"twin_{kind}_worst"] = max(twin.values())
        result[f"tensors_{kind}"] = [
            {"tensor": k, "pair": pair[k], "twin": twin[k], "ratio": pair[k] / max(twin[k], 1e-300)}
            for k in worst
        ]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.rounding_twin", description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, help="keep the runs here")
    ap.add_argument(
        "--twin",
        action="append",
        choices=sorted(TWINS),
        dest="twins",
        help="one: the first element of the largest tensor one ulp up (default); every: every "
        "element one ulp up or down",
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dualtrain-twin-") as tmp:
        result = measure(
            args.config, args.sets, args.out or Path(tmp), twins=tuple(args.twins or ["one"])
        )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
