"""The sweep of issue 46 item 0: the fp64 pair's verdict at every size, faithful and planted.

    python -m tools.reference_sweep [--only NAME ...] [--out DIR] [--json FILE]

Runs ``dualtrain compare --precision fp64`` (the pair, and its rounding twin where the pair parts
beyond the fixed bounds: dualtrain.parity.twin) on the sweep pair of tools/row_transformer.yaml
(a torch nn.TransformerEncoderLayer stack and its Keras MultiHeadAttention port) across widths
16-1024, depths 1-6, 10-500 steps and every optimizer, faithful (must PASS) and with one of the
port's two planted mistakes (LayerNormalization eps 1e-3, tanh-approximated gelu: must FAIL).
Prints one row per case: the verdict, the semantic checks' values against their bounds, whether a
twin ran and how the pair's final weights stand to the twin's (pair / twin, per tensor, worst).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dualtrain.core.weights import load_weights
from dualtrain.parity.readings import rel_diff
from dualtrain.parity.tolerances import REFERENCE
from dualtrain.records.record import WEIGHTS_FINAL

CONFIG = "tools/row_transformer.yaml"
PLANTED = {
    "eps": "model.keras=row_transformer_keras:eps_keras",
    "gelu": "model.keras=row_transformer_keras:gelu_act",
}
SGD_MOMENTUM = ["optimizer.name=sgd", "optimizer.lr=0.05", "optimizer.momentum=0.9"]


def _w(width: int, heads: int = 4) -> list[str]:
    return [f"model.args.width={width}", f"model.args.heads={heads}"]


#: name -> (overrides); every faithful case is also run with each planted mistake where its name
#: is in PLANTED_AT
CASES: dict[str, list[str]] = {
    "w16": _w(16, 2),
    "w32": _w(32),
    "w128": _w(128),
    "w384": _w(384),
    "depth1": ["model.args.depth=1"],
    "depth4": ["model.args.depth=4"],
    "depth6": ["model.args.depth=6"],
    "10steps": ["train.max_steps=10"],
    # digits holds 45 steps an epoch at batch 32: longer runs lift the spec's epochs: 1
    "100steps": ["train.max_steps=100", "train.epochs=null"],
    "500steps": ["train.max_steps=500", "train.epochs=null", "train.log_every=50"],
    "w384-sgd": [*_w(384), "optimizer.name=sgd", "optimizer.lr=0.05"],
    "w384-sgd-momentum": [*_w(384), *SGD_MOMENTUM],
    "w384-adamw": [*_w(384), "optimizer.name=adamw", "optimizer.weight_decay=0.01"],
    "w384-adamax": [*_w(384), "optimizer.name=adamax"],
    "w384-adadelta": [*_w(384), "optimizer.name=adadelta", "optimizer.lr=1.0"],
    "w384-rmsprop": [*_w(384), "optimizer.name=rmsprop"],
    "w768-20steps": [*_w(768, 8), "train.max_steps=20"],
    "w1024-h8-45steps": [*_w(1024, 8), "train.max_steps=45"],
}
PLANTED_AT = ("w16", "w384", "w1024-h8-45steps", "500steps", "w384-sgd-momentum", "w384-rmsprop")


def cases(only: list[str]) -> list[tuple[str, list[str], str]]:
    """(name, overrides, expected verdict) in sweep order."""
    out = []
    for name, sets in CASES.items():
        out.append((name, sets, "PASS"))
        if name in PLANTED_AT:
            out += [(f"{name}+{p}", [*sets, s], "FAIL") for p, s in PLANTED.items()]
    return [c for c in out if not only or c[0] in only or c[0].split("+")[0] in only]


def run_case(name: str, sets: list[str], out: Path) -> dict[str, object]:
    where = out / name
    cmd = [sys.executable, "-m", "dualtrain", "compare", "--config", CONFIG, "--precision", "fp64"]
    cmd += ["--out", str(where), "--overwrite"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        return {"case": name, "verdict": "ERROR", "why": proc.stderr[-2000:], "seconds": took}
    verdict = json.loads((where / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"] if c["name"].startswith("reference_")}
    return {
        "case": name,
        "verdict": "PASS" if verdict["passed"] else "FAIL",
        "twin": (where / "fp64-twin").is_dir(),
        "checks": {n: (c["status"], c["value"], c["tolerance"]) for n, c in checks.items()},
        "pair_over_twin": _pair_over_twin(where),
        "seconds": round(took, 1),
    }


def _pair_over_twin(where: Path) -> float | None:
    """The largest per-tensor ratio of the pair's final-weights difference to the twin's."""
    if not (where / "fp64-twin").is_dir():
        return None
    a = load_weights(where / "torch" / WEIGHTS_FINAL)
    pair = rel_diff(a, load_weights(where / "tf" / WEIGHTS_FINAL))
    twin = rel_diff(a, load_weights(where / "fp64-twin" / WEIGHTS_FINAL))
    return max(pair[k] / max(twin[k], 1e-300) for k in pair)


def row(r: dict[str, object], expected: str) -> str:
    if r["verdict"] == "ERROR":
        return f"| {r['case']} | {expected} | ERROR | | | | |"
    checks = r["checks"]
    assert isinstance(checks, dict)
    cells = [
        f"{checks[n][0]} {checks[n][1]:.3g} / {checks[n][2]:.3g}"
        if checks[n][1] is not None
        else "-"
        for n in ("reference_loss", "reference_weights", "reference_eval")
    ]
    ratio = r["pair_over_twin"]
    ok = "ok" if r["verdict"] == expected else "**WRONG**"
    return (
        f"| {r['case']} | {expected} | {r['verdict']} {ok} | {' | '.join(cells)} | "
        f"{'yes' if r['twin'] else 'no'} | {'' if ratio is None else f'{ratio:.3g}'} | "
        f"{r['seconds']} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.reference_sweep", description=__doc__)
    ap.add_argument("--only", action="append", default=[], metavar="NAME")
    ap.add_argument("--out", type=Path, help="keep the compares here")
    ap.add_argument("--json", type=Path, help="append each case's result here (JSON lines)")
    ap.add_argument(
        "--table",
        type=Path,
        metavar="JSONL",
        help="print the table of an earlier sweep's --json file (the latest row of each case)",
    )
    args = ap.parse_args(argv)
    if args.table:
        latest = {}
        for line in args.table.read_text().splitlines():
            row_ = json.loads(line)
            latest[row_["case"]] = row_
        print("| case | expected | verdict | loss | weights | eval | twin | pair/twin | s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, _, expected in cases([]):
            if name in latest:
                print(row(latest[name], expected))
        return 0
    print(f"twin_factor {REFERENCE.twin_factor:g}; fixed bounds {REFERENCE.weights_rel:g}")
    print("| case | expected | verdict | loss | weights | eval | twin | pair/twin | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    wrong = 0
    with tempfile.TemporaryDirectory(prefix="dualtrain-sweep-") as tmp:
        for name, sets, expected in cases(args.only):
            r = run_case(name, sets, args.out or Path(tmp))
            wrong += r["verdict"] != expected
            print(row(r, expected), flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps({**r, "expected": expected, "sets": sets}) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
