"""Peak memory of a run on a memory-mapped arrays dataset larger than a worker should hold.

Writes a folder of .npy files (uint8 images (N, 1, 64, 64) and int64 labels; --gb of data, 4.2 GB
by default, not committed: --dir, default a temporary folder removed afterwards), trains one epoch
of a small model on it at world 2 with ``dualtrain run``, and samples every worker's memory from
/proc while it runs: VmHWM (peak resident set), and at the peak of RssAnon+RssFile the split into
anonymous memory (what the worker allocated) and file-backed pages (the mapped dataset). The
verdict is the ratio peak RSS / dataset size per worker (no timed assertion anywhere).

    python bench/bench_mmap.py [--gb 4.2] [--backend torch|tf|both] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (1, 64, 64)


def write_dataset(folder: Path, gb: float) -> int:
    """Train rows of SHAPE (uint8, a class per row drawn from its mean brightness so the model has
    something to learn), 10,000 test rows; returns the train row count."""
    folder.mkdir(parents=True, exist_ok=True)
    per = int(np.prod(SHAPE))
    n = int(gb * 1e9) // per
    rng = np.random.default_rng(0)
    for split, rows in (("train", n), ("test", 10_000)):
        x = np.lib.format.open_memmap(folder / f"x_{split}.npy", "w+", np.uint8, (rows, *SHAPE))
        y = np.empty(rows, np.int64)
        for s in range(0, rows, 50_000):
            e = min(s + 50_000, rows)
            level = rng.integers(0, 10, e - s)
            noise = rng.integers(0, 60, (e - s, *SHAPE), dtype=np.uint8)
            x[s:e] = noise + (level * 20).astype(np.uint8)[:, None, None, None]
            y[s:e] = level
        x.flush()
        del x
        np.save(folder / f"y_{split}.npy", y)
    return n


def status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def watch(run_dir: Path, stop: threading.Event, peaks: dict[int, dict[str, int]]) -> None:
    """Every 0.1 s: each worker's (from launch.json) VmHWM, and the RssAnon/RssFile split at its
    largest RSS seen."""
    while not stop.is_set():
        try:
            workers = json.loads((run_dir / "launch.json").read_text())["workers"]
        except (OSError, ValueError, KeyError):
            workers = []
        for w in workers:
            s = status(int(w["pid"]))
            if not s:
                continue
            p = peaks.setdefault(int(w.get("rank", w.get("worker", 0))), {"VmHWM": 0, "VmRSS": 0})
            p["VmHWM"] = max(p["VmHWM"], s.get("VmHWM", 0))
            if s.get("VmRSS", 0) >= p["VmRSS"]:
                p.update(VmRSS=s["VmRSS"], RssAnon=s.get("RssAnon", 0), RssFile=s.get("RssFile", 0))
        time.sleep(0.1)


def run(backend: str, data: Path, out: Path) -> dict:
    spec = {
        "name": "bench_mmap",
        "data": {
            "dataset": "arrays",
            "path": str(data),
            "batch_size": 256,
            "eval_batch_size": 2000,
        },
        "model": {
            "inputs": [{"name": "x", "shape": list(SHAPE)}],
            "preset": None,
            "layers": [
                {"type": "avgpool2d", "pool_size": 4},
                {"type": "flatten"},
                {"type": "dense", "units": 10},
            ],
        },
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "distribution": {"world_size": 2},
        "train": {"epochs": 1, "log_every": 1000},
    }
    config = out.parent / f"{out.name}.yaml"
    config.write_text(json.dumps(spec))
    peaks: dict[int, dict[str, int]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(out, stop, peaks), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dualtrain", "run", "--backend", backend, "--config", str(config)]
        + ["--out", str(out), "--overwrite"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{backend} run failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"peaks": peaks, "wall_s": time.perf_counter() - t0, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=4.2)
    ap.add_argument("--backend", choices=["torch", "tf", "both"], default="both")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="dualtrain-mmap-"))
    data = base / "data"
    try:
        if not (data / "x_train.npy").is_file():
            t0 = time.perf_counter()
            n = write_dataset(data, args.gb)
            print(f"wrote {n:,} train rows in {time.perf_counter() - t0:.0f}s", flush=True)
        size = sum(f.stat().st_size for f in data.glob("*.npy"))
        print(f"dataset: {size / 1e9:.2f} GB in {data}", flush=True)
        for backend in ("torch", "tf") if args.backend == "both" else (args.backend,):
            r = run(backend, data, base / f"run-{backend}")
            s = r["summary"]
            print(
                f"{backend}: {s['steps']} steps, test accuracy {100 * s['test_accuracy']:.2f}%, "
                f"{s['train_samples_per_s']:,.0f} samples/s, wall {r['wall_s']:.0f}s"
            )
            for rank, p in sorted(r["peaks"].items()):
                anon, mapped = p.get("RssAnon", 0) / 1e9, p.get("RssFile", 0) / 1e9
                print(
                    f"  worker {rank}: peak RSS (VmHWM) {p['VmHWM'] / 1e9:.2f} GB = "
                    f"{p['VmHWM'] / size:.3f} x the dataset; at the largest RSS seen: anonymous "
                    f"{anon:.2f} GB, file-backed {mapped:.2f} GB"
                )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
