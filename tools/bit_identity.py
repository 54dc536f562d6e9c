"""Behaviour unchanged, shown: every shipped config's compare, and a few variants that reach the
engines' other paths, run short, before and after a refactor; every array of every run and every
check's value must be equal.

    python -m tools.bit_identity run DIR [--only NAME]   # every case's compare into DIR/NAME
    python -m tools.bit_identity diff BEFORE AFTER       # the table; exits 1 on any difference

A case is ``dualtrain compare --config C --set train.epochs=null --set train.max_steps=STEPS``
(the reference pair, the probes, the rounding twin where compare runs it): each run directory's
``*.npz`` (initial, final, ema weights) are compared with ``np.array_equal`` and verdict.json's
checks by value and verdict. Timings, paths and versions are not compared."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 12
VARIANTS: dict[str, list[str]] = {
    "mnist_mlp-fp16": ["--config", "configs/mnist_mlp.yaml", "--precision", "fp16"],
    "mnist_mlp-bf16": ["--config", "configs/mnist_mlp.yaml", "--precision", "bf16"],
    "mnist_mlp-accumulate": ["--config", "configs/mnist_mlp.yaml", "--set", "train.accumulate=2"],
    "mnist_mlp-ema-clip": [
        "--config",
        "configs/mnist_mlp.yaml",
        "--set",
        "train.ema={decay: 0.9}",
        "--set",
        "optimizer.clip_grad_norm=0.5",
    ],
    "mnist_mlp-ps": [
        "--config",
        "configs/mnist_mlp.yaml",
        "--set",
        "distribution.strategy=parameter_server",
    ],
    "mnist_mlp-world3": ["--config", "configs/mnist_mlp.yaml", "--world-size", "3"],
}


def cases() -> dict[str, list[str]]:
    out = {c.stem: ["--config", str(c)] for c in sorted(Path("configs").glob("*.yaml"))}
    out.update(VARIANTS)
    return out


def run(root: Path, only: str | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    two_inputs = Path("runs/data/digits_two_inputs.npz")  # configs/digits_two_inputs.yaml's data
    if not two_inputs.exists():
        subprocess.run([sys.executable, "examples/own_arrays.py", str(two_inputs)], check=True)
    for name, args in cases().items():
        if only and name != only:
            continue
        out = root / name
        cmd = [sys.executable, "-m", "dualtrain", "compare", *args, "--out", str(out)]
        cmd += ["--set", "train.epochs=null", "--set", f"train.max_steps={STEPS}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        print(f"{name}: rc {res.returncode}", flush=True)
        (root / f"{name}.log").write_text(res.stdout + res.stderr)


def checks(verdict: Path) -> dict[str, Any]:
    if not verdict.exists():
        return {}
    data = json.loads(verdict.read_text())
    scored = {
        c["name"]: (c.get("value"), c.get("status"))
        for c in data.get("checks", [])
        if c["name"] != "throughput"  # timing, not arithmetic
    }
    return scored | {"passed": data.get("passed")}


def arrays(case: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(case.rglob("*.npz")):
        if "layers_step" in f.name:
            continue
        with np.load(f) as z:
            out.update({f"{f.relative_to(case)}:{k}": z[k] for k in z.files})
    return out


def diff(before: Path, after: Path) -> int:
    bad = 0
    print("| case | arrays | equal | checks | equal |\n|---|---|---|---|---|")
    for name in cases():
        a, b = arrays(before / name), arrays(after / name)
        same = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        ca, cb = checks(before / name / "verdict.json"), checks(after / name / "verdict.json")
        same_checks = bool(ca) and ca == cb
        bad += not (same and same_checks and a)
        print(f"| {name} | {len(a)} | {same} | {len(ca)} | {same_checks} |")
        if not same:
            for k in sorted(a.keys() | b.keys()):
                if k not in a or k not in b or not np.array_equal(a[k], b[k]):
                    print(f"    differs: {k}")
                    break
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--only")
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    a = p.parse_args()
    if a.cmd == "run":
        run(a.dir, a.only)
    else:
        sys.exit(diff(a.before, a.after))


if __name__ == "__main__":
    main()
