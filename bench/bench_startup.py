"""A run's fixed cost: a one-step MLP run, command to exit, and where its time goes.

The command is the one a new user's first runs pay for every time (issue 30):

    dualtrain run --backend B --config configs/mnist_mlp.yaml --world-size 2 --set train.max_steps=1
        --set train.epochs=null --set data.test_limit=100 --set logging.tensorboard=false

Each repeat runs it once per backend, alternating (the machine is shared and noisy: compare the
numbers of one invocation), timed from the command's start to its exit. The phases come from the
chief's summary.json (``startup``, dualtrain.runtime.clock; ``train_wall_s``, ``eval_wall_s``,
``ended_at``): the launcher before it starts the workers (the CLI's imports, the spec and the data
checks, the run directory), the worker's process start, its framework import, its settings
(torch: determinism, which imports torch._dynamo as DDP needs it), the rendezvous, building the
engine (data, weights, model, DDP or the traced step), the one step, the evaluation, the rest of the
worker's run (writing the run directory), and what follows the chief's summary until the command
exits (the workers' exit, the launcher's wrap-up).

    python bench/bench_startup.py [--repeats 5] [--backends torch tf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [
    "run",
    "--config",
    str(ROOT / "configs" / "mnist_mlp.yaml"),
    "--world-size",
    "2",
    "--set",
    "train.max_steps=1",
    "--set",
    "train.epochs=null",
    "--set",
    "data.test_limit=100",
    "--set",
    "logging.tensorboard=false",
]
PHASES = (
    "launcher",
    "process_s",
    "imports_s",
    "settings_s",
    "rendezvous_s",
    "engine_s",
    "train",
    "eval",
    "run rest",
    "exit",
)


def once(backend: str, out: Path) -> dict[str, float]:
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "dualtrain", *COMMAND, "--backend", backend, "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    total = time.time() - t0
    if done.returncode != 0:
        raise SystemExit(f"{backend} run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    if "startup" not in s:  # a dualtrain from before the start-up clock: the total only
        return {"total": total} | {k: float("nan") for k in PHASES}
    up = s["startup"]
    row = {"total": total, "launcher": up["spawned_at"] - t0}
    row |= {k: up.get(k) or 0.0 for k in PHASES if k.endswith("_s")}
    row["train"], row["eval"] = s["train_wall_s"], s["eval_wall_s"]
    worker = sum(row[k] for k in PHASES[1:8])
    row["run rest"] = (s["ended_at"] - up["spawned_at"]) - worker
    row["exit"] = t0 + total - s["ended_at"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backends", nargs="+", default=["torch", "tf"])
    args = ap.parse_args(argv)
    rows: dict[str, list[dict[str, float]]] = {b: [] for b in args.backends}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for b in args.backends:
                rows[b].append(once(b, Path(tmp) / f"{b}-{i}"))
                print(f"{b} run {i + 1}: {rows[b][-1]['total']:.2f} s", flush=True)
    print()
    head = ["phase (median s)", *args.backends]
    table = [head, ["-" * len(h) for h in head]]
    for k in (*PHASES, "total"):
        table.append([k, *(f"{statistics.median(r[k] for r in rows[b]):.2f}" for b in rows)])
    table.append(
        [
            "total min-max",
            *(
                f"{min(r['total'] for r in v):.2f}-{max(r['total'] for r in v):.2f}"
                for v in rows.values()
            ),
        ]
    )
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
