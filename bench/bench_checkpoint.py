"""What a checkpoint costs: seconds per save, and that time as a fraction of the training time.

For each model (configs/mnist_mlp.yaml, configs/mnist_cnn.yaml) and backend, one epoch at world 2
with ``checkpoint_every`` steps. Reported: the chief's time inside the checkpoint writes divided by
the number of saves (summary.json ``checkpoint_wall_s`` / ``checkpoints_written``: exporting the
state, serialising, fsync, rename; the other workers wait that long at their next collective), the
checkpoint's size, and the writes' share of the run (checkpoint time / (training time + checkpoint
time)), both measured in the same run, so the ratio holds on a shared, noisy machine.

    python bench/bench_checkpoint.py [--every 50] [--backends torch tf] [--models mlp cnn]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dualtrain.driver.runs import start_run  # noqa: E402
from dualtrain.runtime import checkpoint  # noqa: E402
from dualtrain.spec import Backend, load_spec  # noqa: E402

CONFIGS = {"mlp": ROOT / "configs" / "mnist_mlp.yaml", "cnn": ROOT / "configs" / "mnist_cnn.yaml"}


def one(model: str, backend: str, every: int | None) -> dict:
    over = [
        "train.epochs=1",
        "distribution.world_size=2",
        "train.log_every=1000",
        *([f"train.checkpoint_every={every}", "train.keep_checkpoints=2"] if every else []),
    ]
    spec = load_spec(CONFIGS[model], over)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, summary = start_run(spec, Backend(backend), Path(tmp) / "run")
        latest = checkpoint.latest(run_dir)
        size = sum(f.stat().st_size for f in latest.iterdir()) if latest else 0
    return {**summary, "checkpoint_bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=50, help="checkpoint_every (steps)")
    ap.add_argument("--backends", nargs="*", default=["torch", "tf"])
    ap.add_argument("--models", nargs="*", default=["mlp", "cnn"])
    args = ap.parse_args()
    rows = []
    for model in args.models:
        for backend in args.backends:
            saved = one(model, backend, args.every)
            n, ck = saved["checkpoints_written"], saved["checkpoint_wall_s"]
            rows.append(
                (
                    model,
                    backend,
                    n,
                    ck / max(n, 1),
                    saved["checkpoint_bytes"] / 1e6,
                    ck / (saved["train_wall_s"] + ck),
                )
            )
    print(f"\ncheckpoint_every={args.every}, 1 epoch, world 2")
    print("| model | backend | saves | s per save | MB per checkpoint | share of the run |")
    print("|---|---|---|---|---|---|")
    for model, backend, n, per, mb, share in rows:
        print(f"| {model} | {backend} | {n} | {per:.3f} | {mb:.2f} | {100 * share:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
