"""The arithmetic fingerprint: a few fixed runs' final-weight digests, recorded in CHANGELOG.md.

    python -m tools.arithmetic [--out DIR]       # the digests today, against CHANGELOG.md's
    python -m tools.arithmetic --table           # the table for a new CHANGELOG.md entry

Any change that alters a backend's results (an op, an update rule, a kernel choice, a framework
upgrade) changes some of these digests. CHANGELOG.md's newest entry records the digests of the code
it describes; tests/integration/test_arithmetic_changes.py runs the fixed runs and fails on a digest
that no entry announced, naming the run. So a change to arithmetic lands with an entry that says
which runs change and by how much (measure it: ``--against REV`` runs the same runs at another
commit and prints each run's largest relative change of a tensor).

The runs are pinned so every machine of this kind reproduces them bit for bit, whatever its CPU:
one intra-op thread per worker, and the ``avx2`` kernel setting (torch's ATen at AVX2 with its
oneDNN off, TensorFlow's oneDNN off, MKL at AVX2 with its conditional numerical reproducibility).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dualtrain.core.weights import Weights, load_weights, weights_digest
from dualtrain.parity.readings import rel_diff
from dualtrain.records.record import WEIGHTS_FINAL

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"

#: the kernel setting every x86 machine with AVX2 reproduces (../shared/tools/under-kernels'
#: ``avx2``, with MKL's reproducibility mode)
KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "DUALTRAIN_TORCH_MKLDNN": "0",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "MKL_CBWR": "AVX2",
}
#: every fixed run: 640 MNIST samples, world 2, one intra-op thread per worker, one epoch (5 steps)
COMMON = (
    "data.train_limit=640",
    "data.test_limit=200",
    "train.epochs=1",
    "distribution.threads_per_worker=1",
    "logging.tensorboard=false",
)


@dataclass(frozen=True)
class FixedRun:
    name: str
    backend: str
    config: str
    sets: tuple[str, ...] = ()

    def command(self, out: Path) -> list[str]:
        cmd = [sys.executable, "-m", "dualtrain", "run", "--backend", self.backend]
        cmd += ["--config", str(ROOT / "configs" / self.config), "--out", str(out)]
        for s in (*COMMON, *self.sets):
            cmd += ["--set", s]
        return cmd


RUNS = (
    FixedRun("mlp torch fp32", "torch", "mnist_mlp.yaml"),
    FixedRun("mlp tf fp32", "tf", "mnist_mlp.yaml"),
    FixedRun("mlp torch fp64", "torch", "mnist_mlp.yaml", ("precision.dtype=fp64",)),
    FixedRun("mlp tf fp64", "tf", "mnist_mlp.yaml", ("precision.dtype=fp64",)),
    FixedRun("cnn torch fp32", "torch", "mnist_cnn.yaml"),
    FixedRun("cnn tf fp32", "tf", "mnist_cnn.yaml"),
)


def final_weights(run_dir: Path) -> Weights:
    return load_weights(run_dir / WEIGHTS_FINAL)


def run_all(
    out: Path,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
    runs: tuple[FixedRun, ...] = RUNS,
) -> dict[str, Path]:
    """The fixed runs (every one unless ``runs``) into ``out``, with the code at ``root``, under
    :data:`KERNELS` and ``env``; each run's folder by name."""
    full = {**os.environ, **KERNELS, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), full.get("PYTHONPATH", "")) if p)
    dirs = {}
    for run in runs:
        d = out / run.name.replace(" ", "-")
        proc = subprocess.run(
            run.command(d), env=full, cwd=root, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{run.name} failed:\n{proc.stderr[-3000:]}")
        dirs[run.name] = d
    return dirs


def digests(dirs: dict[str, Path]) -> dict[str, str]:
    """Each run's final weights digest (dualtrain.core.weights.weights_digest: equal only where
    bit-identical)."""
    return {name: weights_digest(final_weights(d)) for name, d in dirs.items()}


#: a row of CHANGELOG.md's digest tables: | run | digest |
ROW = re.compile(r"^\|\s*([a-z0-9 ]+?)\s*\|\s*`([0-9a-f]{16})`\s*\|\s*$")


def recorded(changelog: Path = CHANGELOG) -> dict[str, str]:
    """The digests of CHANGELOG.md's newest entry that has them (the first table from the top)."""
    found: dict[str, str] = {}
    for line in changelog.read_text().splitlines():
        m = ROW.match(line)
        if m:
            found[m.group(1)] = m.group(2)
        elif found and not line.startswith("|"):
            break
    return found


def unannounced(now: dict[str, str], changelog: Path = CHANGELOG) -> list[str]:
    """The runs whose digest is not the one CHANGELOG.md's newest entry records, each with both."""
    said = recorded(changelog)
    return [
        f"{name}: {now[name]} (CHANGELOG.md records {said.get(name, 'nothing')})"
        for name in now
        if said.get(name) != now[name]
    ]


def table(now: dict[str, str]) -> str:
    rows = [f"| {name} | `{d}` |" for name, d in now.items()]
    return "\n".join(["| run | final weights digest |", "|---|---|", *rows])


def changes(a: dict[str, Path], b: dict[str, Path]) -> dict[str, tuple[str, float]]:
    """Per run: the tensor whose final weights moved most between two sets of runs, and by how
    much (||b - a|| / ||a||)."""
    out = {}
    for name in a:
        rel = rel_diff(final_weights(a[name]), final_weights(b[name]))
        worst = max(rel, key=rel.__getitem__)
        out[name] = (worst, rel[worst])
    return out


def _checkout(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.arithmetic", description=__doc__)
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--table", action="store_true", help="print the table for CHANGELOG.md")
    ap.add_argument("--against", metavar="REV", help="also run REV; print each run's change")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dualtrain-arith-") as tmp:
        out = args.out or Path(tmp)
        dirs = run_all(out / "now")
        now = digests(dirs)
        if args.table:
            print(table(now))
        if args.against:
            other = _checkout(args.against, Path(tmp) / "code")
            try:
                before = run_all(out / "rev", root=other)
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)],
                    check=False,
                    capture_output=True,
                )
            for name, (tensor, rel) in changes(before, dirs).items():
                print(f"{name}: largest change {rel:.3g} relative ({tensor}) since {args.against}")
        off = unannounced(now)
        for line in off:
            print(f"unannounced: {line}")
        if not off:
            print(f"every fixed run's digest is the one CHANGELOG.md records ({len(now)} runs)")
        return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
