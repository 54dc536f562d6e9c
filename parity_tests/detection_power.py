"""Measure what the semantic check detects: every mutant of parity_tests/mutants.py at the size the
issue names, and, for mutants with a size, the smallest size (powers of ten) at which the fp64
reference pair still fails.

    python -m parity_tests.detection_power [--out DIR] [--only NAME ...]

Prints the Markdown table of docs/parity.md §7 (and writes it to DIR/detection_power.md). Each trial is
one mutated fp64 tf run compared with the unmutated fp64 torch run of the same spec (the reference pair
``dualtrain compare`` runs), through dualtrain.compare.compare_records. About 4 minutes on 2 cores.
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
from dualtrain.compare import compare_records
from dualtrain.compare.records import loss_diff
from dualtrain.record import read_run
from dualtrain.runs import start_run
from dualtrain.spec import load_spec

from .mutants import MUTANTS, SPECS, hook

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "mnist_mlp.yaml"


def run(out: Path, backend: str, overrides: tuple[str, ...], env: dict[str, str] | None = None) -> Path:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            start_run(load_spec(CONFIG, ["train.log_every=1000000", *overrides]),
                      parse_backend(backend), out, overwrite=True)
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
    return {"detected": not cmp.passed, "cause": d.cause, "category": d.category,
            "step": d.first_divergent_step, "max_loss_diff": float(diff.max()) if diff.size else 0.0,
            "right_cause": (not cmp.passed) and d.cause == m.cause}


def smallest_detected(base: Path, name: str, reference: Path, start: float) -> tuple[float | None, float]:
    """Walk down by powers of ten from ``start``: (smallest detected size, first size not detected)."""
    found, size = None, start
    while size >= 1e-17:
        if not trial(base, name, size, reference)["right_cause"]:
            return found, size
        found = size
        size /= 10.0
    return found, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these mutants only")
    args = ap.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="dualtrain-detection-"))
    base.mkdir(parents=True, exist_ok=True)
    names = args.only or list(MUTANTS)
    t0 = time.perf_counter()
    refs = {spec: run(base / f"reference-{spec}", "torch", overrides)
            for spec, overrides in SPECS.items() if any(MUTANTS[n].spec == spec for n in names)}
    clean = {spec: compare_records(read_run(r), read_run(run(base / f"clean-{spec}", "tf",
                                                             SPECS[spec]))) for spec, r in refs.items()}
    rows = ["| mutant | at the issue's size: verdict, cause, first divergent step, fp64 max \\|Δloss\\| "
            "| smallest size detected (next size down: not detected) |", "|---|---|---|"]
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
        rows.append(f"| `{name}`: {at} | {verdict}, {t['cause']}{ok}, step {t['step']}, "
                    f"{t['max_loss_diff']:.1e} | {found} |")
        print(rows[-1], flush=True)
    ref_rows = [f"unmutated pair ({spec}): {'PASS' if c.passed else 'FAIL'}, fp64 max |Δloss| "
                f"{loss_diff(c.a, c.b)[1].max():.1e}" for spec, c in clean.items()]
    text = "\n".join(rows + ["", *ref_rows,
                             f"({time.perf_counter() - t0:.0f} s; runs in {base})"]) + "\n"
    (base / "detection_power.md").write_text(text)
    print(text)
    return 0 if all(c.passed for c in clean.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
