"""Measure what the semantic check detects: every mutant of tools/mutants/ at the size the
issue names, and, for mutants with a size, the smallest size (powers of ten) at which the fp64
reference pair still fails.

    python -m tools.detection_power [--out DIR] [--only NAME ...] [--precision]

Prints the Markdown table of docs/parity.md §7 (and writes it to DIR/detection_power.md). Each trial
is one mutated fp64 tf run compared with the unmutated fp64 torch run of the same spec (the
reference pair ``dualtrain compare`` runs), through dualtrain.parity.compare_records. About 4
minutes on 2 cores.

``--precision``: the precision-path mutants (PRECISION_MUTANTS) instead, on both backends: each
trial is the mutated backend's run at the mutant's precision against the other backend's unmutated
run, both replaying the probes of one fp64 pair (as ``dualtrain compare --config`` makes them);
detected means FAIL naming that backend's path. About 6 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

from dualtrain.backends import parse_backend
from dualtrain.driver.runs import start_run
from dualtrain.parity import compare_dirs, compare_records
from dualtrain.parity.readings import loss_diff
from dualtrain.records.record import read_run
from dualtrain.runtime import probes
from dualtrain.spec import load_spec
from tools.mutants import MUTANTS, PRECISION_MUTANTS, PRECISION_SPEC, SPECS, hook

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "mnist_mlp.yaml"


def run(
    out: Path,
    backend: str,
    overrides: tuple[str, ...],
    env: dict[str, str] | None = None,
    probe: probes.Role | None = None,
) -> Path:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            start_run(
                load_spec(CONFIG, ["train.log_every=1000000", *overrides]),
                parse_backend(backend),
                out,
                overwrite=True,
                probe=probe,
            )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return out


def trial(base: Path, name: str, size: float | None, reference: Path) -> dict:
    m = MUTANTS[name]
    tag = f"{name}-{size!r}" if size is not None else name
    b = run(base / tag, "tf", SPECS[m.spec], hook(name, size))
    cmp = compare_records(read_run(reference), read_run(b))
    _, diff = loss_diff(cmp.a, cmp.b)
    d = cmp.diagnosis
    return {
        "detected": not cmp.passed,
        "cause": d.cause,
        "category": d.category,
        "step": d.first_divergent_step,
        "max_loss_diff": float(diff.max()) if diff.size else 0.0,
        "right_cause": (not cmp.passed) and d.cause == m.cause,
    }


def smallest_detected(
    base: Path, name: str, reference: Path, start: float
) -> tuple[float | None, float]:
    """Walk down by powers of ten from ``start``: (smallest detected size, first size not
    detected)."""
    found, size = None, start
    while size >= 1e-17:
        if not trial(base, name, size, reference)["right_cause"]:
            return found, size
        found = size
        size /= 10.0
    return found, size


def precision_table(base: Path, names: list[str]) -> tuple[list[str], bool]:
    """Rows of the precision-path mutants' table; whether every unmutated pair passed."""
    ref = run(
        base / "p-fp64-torch",
        "torch",
        (*PRECISION_SPEC, "precision.dtype=fp64"),
        probe=probes.RECORD,
    )
    ref_tf = run(base / "p-fp64-tf", "tf", (*PRECISION_SPEC, "precision.dtype=fp64"))
    replay = probes.replay(ref)
    clean: dict[tuple[str, str], Path] = {}

    def clean_run(backend: str, path: str) -> Path:
        if (backend, path) not in clean:
            clean[backend, path] = run(
                base / f"p-{path}-{backend}",
                backend,
                (*PRECISION_SPEC, f"precision.dtype={path}"),
                probe=replay,
            )
        return clean[backend, path]

    def trial_p(name: str, backend: str, size: float | None) -> tuple[bool, str]:
        m = PRECISION_MUTANTS[name]
        tag = f"p-{name}-{backend}-{size!r}"
        mutated = run(
            base / tag,
            backend,
            (*PRECISION_SPEC, f"precision.dtype={m.path}"),
            hook(name, size, backend=backend),
            probe=replay,
        )
        other = clean_run("tf" if backend == "torch" else "torch", m.path)
        a, b = (mutated, other) if backend == "torch" else (other, mutated)
        cmp = compare_dirs(a, b, (ref, ref_tf))
        want = f"{backend} {m.path} path"
        failed = [c.name for c in cmp.checks if c.culprits]
        return (
            not cmp.passed and cmp.diagnosis.culprits == [want],
            f"{'FAIL' if not cmp.passed else 'PASS'}, {cmp.diagnosis.category}"
            f"{': ' + ', '.join(cmp.diagnosis.culprits) if cmp.diagnosis.culprits else ''} "
            f"({', '.join(failed) or 'no local check failed'})",
        )

    rows = [
        "| mutant (path) | backend | at the size named: verdict (failing checks) | smallest size "
        "detected (next size down: not detected) |",
        "|---|---|---|---|",
    ]
    for name in names:
        m = PRECISION_MUTANTS[name]
        for backend in ("torch", "tf"):
            ok, text = trial_p(name, backend, m.size)
            found = "n/a (no size)"
            if m.size is not None and ok:
                small, size = m.size, m.size / 10.0
                while size >= 1e-12 and trial_p(name, backend, size)[0]:
                    small, size = size, size / 10.0
                found = f"{small:.0e} {m.unit} ({size:.0e}: not detected)"
            rows.append(
                f"| `{name}` ({m.path}): {m.what}"
                f"{f' (size {m.size:g})' if m.size is not None else ''} | {backend} | "
                f"{text}{'' if ok else ' **(wrong or no culprit)**'} | {found} |"
            )
            print(rows[-1], flush=True)
    passed = True
    for path in sorted({PRECISION_MUTANTS[n].path for n in names}):
        cmp = compare_dirs(clean_run("torch", path), clean_run("tf", path), (ref, ref_tf))
        rows.append(f"\nunmutated {path} pair: {'PASS' if cmp.passed else 'FAIL'}")
        passed &= cmp.passed
    return rows, passed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=None, help="keep the runs here (default: a temp dir)"
    )
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these mutants only")
    ap.add_argument("--precision", action="store_true", help="the precision-path mutants instead")
    args = ap.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="dualtrain-detection-"))
    base.mkdir(parents=True, exist_ok=True)
    if args.precision:
        t0 = time.perf_counter()
        rows, passed = precision_table(base, args.only or list(PRECISION_MUTANTS))
        text = "\n".join(rows + [f"({time.perf_counter() - t0:.0f} s; runs in {base})"]) + "\n"
        (base / "detection_power_precision.md").write_text(text)
        print(text)
        return 0 if passed else 1
    names = args.only or list(MUTANTS)
    t0 = time.perf_counter()
    refs = {
        spec: run(base / f"reference-{spec}", "torch", overrides)
        for spec, overrides in SPECS.items()
        if any(MUTANTS[n].spec == spec for n in names)
    }
    clean = {
        spec: compare_records(read_run(r), read_run(run(base / f"clean-{spec}", "tf", SPECS[spec])))
        for spec, r in refs.items()
    }
    rows = [
        "| mutant | at the issue's size: verdict, cause, first divergent step, "
        "fp64 max \\|Δloss\\| | smallest size detected (next size down: not detected) |",
        "|---|---|---|",
    ]
    for name in names:
        m = MUTANTS[name]
        t = trial(base, name, m.size, refs[m.spec])
        verdict = "FAIL" if t["detected"] else "**PASS (missed)**"
        ok = "" if t["right_cause"] else " **(wrong cause)**"
        at = f"{m.what}{f' (size {m.size:g})' if m.size is not None else ''}"
        found = "n/a (no size)"
        if m.size is not None and t["right_cause"]:
            small, missed = smallest_detected(base, name, refs[m.spec], m.size / 10.0)
            small = small if small is not None else m.size
            found = f"{small:.0e} {m.unit} ({missed:.0e}: not detected)"
        rows.append(
            f"| `{name}`: {at} | {verdict}, {t['cause']}{ok}, step {t['step']}, "
            f"{t['max_loss_diff']:.1e} | {found} |"
        )
        print(rows[-1], flush=True)
    ref_rows = [
        f"unmutated pair ({spec}): {'PASS' if c.passed else 'FAIL'}, fp64 max |Δloss| "
        f"{loss_diff(c.a, c.b)[1].max():.1e}"
        for spec, c in clean.items()
    ]
    text = (
        "\n".join(rows + ["", *ref_rows, f"({time.perf_counter() - t0:.0f} s; runs in {base})"])
        + "\n"
    )
    (base / "detection_power.md").write_text(text)
    print(text)
    return 0 if all(c.passed for c in clean.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
