"""Wall time of ``dualtrain compare`` with the one-step probes against the same compare before them.

The probes (dualtrain.runtime.probes) add work to a compare: the fp64 torch run saves its state at a
few steps, and both requested-precision runs replay one step from each after their training. This
runs ``dualtrain compare --config configs/mnist_mlp.yaml --world-size 2`` (2 epochs, the shipped
config) from this checkout and from the commit before the probes (a temporary git worktree),
alternately, and reports the median wall times and their ratio, measured side by side in one run
(the machine is shared and noisy: never compare timings from different runs).

    python bench/bench_compare.py [--repeats 3] [--base REV] [--set KEY=VALUE ...]

``--base``: the commit to compare against (default: the parent of the commit that added
dualtrain/runtime/probes.py). Uses this interpreter (the project's .venv) for both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def default_base() -> str:
    added = git(
        "log", "--diff-filter=A", "--format=%H", "--", "dualtrain/runtime/probes.py"
    ).splitlines()
    if not added:
        raise SystemExit("dualtrain/runtime/probes.py is not committed yet: pass --base REV")
    return f"{added[-1]}^"


def compare_once(tree: Path, out: Path, sets: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), TF_CPP_MIN_LOG_LEVEL="2")
    args = [
        sys.executable,
        "-m",
        "dualtrain",
        "compare",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--world-size",
        "2",
        "--out",
        str(out),
    ]
    for s in sets:
        args += ["--set", s]
    t0 = time.perf_counter()
    res = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(
            f"compare in {tree} failed ({res.returncode}):\n{res.stdout[-2000:]}"
            f"\n{res.stderr[-2000:]}"
        )
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base", default=None, help="the commit to compare against")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    base = args.base or default_base()
    tmp = Path(tempfile.mkdtemp(prefix="dualtrain-bench-compare-"))
    worktree = tmp / "base"
    git("worktree", "add", "--detach", str(worktree), base)
    times: dict[str, list[float]] = {"base": [], "probes": []}
    try:
        for i in range(args.repeats):
            for label, tree in (("base", worktree), ("probes", ROOT)):
                out = tmp / f"{label}-{i}"
                took = compare_once(tree, out, args.set)
                times[label].append(took)
                print(f"round {i + 1}: {label:6s} {took:6.1f}s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        git("worktree", "remove", "--force", str(worktree))
        shutil.rmtree(tmp, ignore_errors=True)
    mb, mp = statistics.median(times["base"]), statistics.median(times["probes"])
    print(
        f"base {git('rev-parse', '--short', base)}: median {mb:.1f}s; with probes: median "
        f"{mp:.1f}s; ratio {mp / mb:.3f} (acceptance: <= 1.30)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
