"""The arithmetic fingerprint: a few fixed runs' final-weight digests, recorded in CHANGELOG.md.

    python -m tools.arithmetic [--out DIR]   # the digests today, against what CHANGELOG.md holds
    python -m tools.arithmetic --table       # the table for a new CHANGELOG.md entry

Any change that alters a backend's results (an op, an update rule, a kernel choice, a framework
upgrade) changes some of these digests. tests/integration/test_arithmetic_changes.py runs the fixed
runs and fails on a digest that no entry announced, naming the run. So a change to arithmetic lands
with an entry that says which runs change and by how much (measure it: ``--against REV`` runs the
same runs at another commit and prints each run's largest relative change of a tensor).

The runs are pinned to one intra-op thread per worker and the ``avx2`` kernel setting (torch's ATen
at AVX2 with its oneDNN off, TensorFlow's oneDNN off, MKL at AVX2 in its reproducible mode). That
makes them bit-identical run to run on one machine, not across machines: an AMD EPYC gives other
fp32 digests, and another torch fp64 one, than the Xeon the first table was taken on (MKL's AVX2
branch and TensorFlow's Eigen differ between the two). So a table is recorded per machine
(:func:`machine`), and on a machine that has none the reference is computed here: the fixed runs of
the commit that wrote the newest table, run on this machine with these frameworks. The frameworks'
versions are part of the entry (:func:`versions`), so an upgrade needs an entry on every machine.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import metadata
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

    def command(self, out: Path, root: Path = ROOT) -> list[str]:
        cmd = [sys.executable, "-m", "dualtrain", "run", "--backend", self.backend]
        cmd += ["--config", str(root / "configs" / self.config), "--out", str(out)]
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
            run.command(d, root), env=full, cwd=root, capture_output=True, text=True, check=False
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
#: the line above a table that names the machine it was taken on: Machine: `...`
MACHINE = re.compile(r"^Machine: `([^`]+)`")
#: the line of an entry that names the frameworks its digests were taken with: Frameworks: `...`
FRAMEWORKS = re.compile(r"^Frameworks: `([^`]+)`")
#: the packages whose version is part of the arithmetic
PACKAGES = ("torch", "tensorflow", "keras", "numpy")


def machine() -> str:
    """This machine as the digests see it: the CPU's vendor and model, and its cache sizes (MKL's
    and Eigen's blocking follow them)."""
    info = {}
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else ():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches.append(f"{name} {(index / 'size').read_text().strip()}")
    vendor = info.get("vendor_id", platform.machine())
    return ", ".join([f"{vendor} {info.get('model name', platform.processor())}", *caches])


def versions() -> str:
    """The frameworks these digests are taken with: each of :data:`PACKAGES` and its version."""
    return ", ".join(f"{p} {metadata.version(p)}" for p in PACKAGES)


def _entry(changelog: Path) -> list[str]:
    """The lines of CHANGELOG.md's newest entry that has digests."""
    entry: list[str] = []
    for line in changelog.read_text().splitlines():
        if line.startswith("## "):
            if any(ROW.match(e) for e in entry):
                break
            entry = []
        entry.append(line)
    return entry


def recorded(where: str | None = None, changelog: Path = CHANGELOG) -> dict[str, str]:
    """The digests CHANGELOG.md's newest entry records for the machine ``where`` (default: this
    one); none where it has no table for it (a table that names no machine matches none)."""
    where = machine() if where is None else where
    tables: dict[str | None, dict[str, str]] = {}
    on: str | None = None
    for line in _entry(changelog):
        m, row = MACHINE.match(line), ROW.match(line)
        if m:
            on = m.group(1)
        elif row:
            tables.setdefault(on, {})[row.group(1)] = row.group(2)
    return tables.get(where, {})


def recorded_versions(changelog: Path = CHANGELOG) -> str | None:
    """The frameworks CHANGELOG.md's newest entry with digests names (None: it names none)."""
    return next((m.group(1) for e in _entry(changelog) if (m := FRAMEWORKS.match(e))), None)


def table_commit(root: Path = ROOT) -> str:
    """The newest commit that wrote a row of a digest table into CHANGELOG.md."""
    proc = subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "log",
            "-n1",
            "--format=%H",
            "-G",
            "`[0-9a-f]{16}`",
            "--",
            "CHANGELOG.md",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(
            f"no commit of {root} wrote CHANGELOG.md's digests (a clone without its history?): "
            f"{proc.stderr.strip()}"
        )
    return proc.stdout.strip()


def export(rev: str, into: Path, root: Path = ROOT) -> Path:
    """The files of commit ``rev`` written into ``into`` (git archive; no worktree is left)."""
    tar = subprocess.run(["git", "-C", str(root), "archive", rev], capture_output=True, check=True)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into


def expected(out: Path, runs: tuple[FixedRun, ...] = RUNS) -> tuple[dict[str, str], str]:
    """What each of ``runs`` must digest to, and where that comes from: CHANGELOG.md's table for
    this machine, or else the same runs of the commit that wrote the newest table, run here."""
    said = recorded()
    if all(r.name in said for r in runs):
        return {r.name: said[r.name] for r in runs}, "CHANGELOG.md records"
    rev = table_commit()
    code = export(rev, out / "code")
    return digests(run_all(out / "runs", root=code, runs=runs)), f"{rev[:10]} gives here"


def unannounced(now: dict[str, str], said: dict[str, str], source: str) -> list[str]:
    """The runs whose digest is not the expected one (``said``, from ``source``), each with both."""
    return [
        f"{name}: {now[name]} ({source} {said.get(name, 'nothing')})"
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
            print(f"Frameworks: `{versions()}`\n\nMachine: `{machine()}`\n\n{table(now)}")
        if args.against:
            before = run_all(out / "rev", root=export(args.against, Path(tmp) / "code"))
            for name, (tensor, rel) in changes(before, dirs).items():
                print(f"{name}: largest change {rel:.3g} relative ({tensor}) since {args.against}")
        off = unannounced(now, *expected(out / "expected"))
        if recorded_versions() != versions():
            off.append(f"frameworks: {versions()} (CHANGELOG.md records {recorded_versions()})")
        for line in off:
            print(f"unannounced: {line}")
        if not off:
            print(f"every fixed run's digest is the expected one ({len(now)} runs)")
        return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
