"""The acceptance matrix of the compare verdict: every shipped config, world sizes 1-4, mirrored and
multi_worker, fp32/fp16/bf16, each judged against its fp64 reference pair and by the one-step
probes from its fp64 torch run's states (as ``dualtrain compare --config`` does).

    python -m tools.compare_matrix [--out DIR] [--train-limit N] [--configs mnist_mlp ...]

Prints one row per (config, world size, strategy, precision) with the verdict and the numbers behind
it, and exits 1 if any verdict is not PASS. The fp64 pair of a (config, world, strategy) is run once
and shared by its three precisions (it is the same spec in fp64). Runs are short by default
(--train-limit 2600: a partial last batch, uneven shards); about 12 minutes on 2 cores.

By default each strategy runs at an odd and an even world size (1 and 4 mirrored, 3 multi_worker, 2
both); ``--other-strategies`` runs the pairs that leaves out, so the two together cover world sizes
1-4 with both strategies.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from dualtrain.backends import parse_backend
from dualtrain.driver.runs import start_run
from dualtrain.parity import compare_dirs
from dualtrain.runtime import probes
from dualtrain.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "fp16", "bf16")
# world size -> strategies (both at world 2; otherwise alternate, so each appears at odd and even
# sizes)
WORLDS = {1: ("mirrored",), 2: ("mirrored", "multi_worker"), 3: ("multi_worker",), 4: ("mirrored",)}


def run(
    out: Path, backend: str, config: Path, overrides: list[str], probe: probes.Role | None = None
) -> Path:
    if not (out / "summary.json").is_file():
        with contextlib.redirect_stdout(io.StringIO()):
            start_run(
                load_spec(config, ["train.log_every=1000000", *overrides]),
                parse_backend(backend),
                out,
                overwrite=True,
                probe=probe,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--train-limit", type=int, default=2600)
    ap.add_argument("--configs", nargs="*", default=["mnist_mlp", "mnist_cnn"])
    ap.add_argument(
        "--other-strategies",
        action="store_true",
        help="only the (world, strategy) pairs the default leaves out (world 1 "
        "and 4 multi_worker, world 3 mirrored): both runs together cover "
        "every world size 1-4 with both strategies",
    )
    args = ap.parse_args(argv)
    both = ("mirrored", "multi_worker")
    worlds = (
        {w: tuple(s for s in both if s not in WORLDS[w]) for w in WORLDS}
        if args.other_strategies
        else WORLDS
    )
    base = args.out or Path(tempfile.mkdtemp(prefix="dualtrain-matrix-"))
    t0 = time.perf_counter()
    rows = [
        "| config | world | strategy | precision | verdict | fp64 pair \\|Δloss\\| / weights | "
        "trajectory | final weights | eval | local loss / grad / update (x bound) | convergence |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    bad = 0
    for name in args.configs:
        config = ROOT / "configs" / f"{name}.yaml"
        for world, strategies in worlds.items():
            for strategy in strategies:
                common = [
                    f"data.train_limit={args.train_limit}",
                    "data.test_limit=1000",
                    "train.epochs=1",
                    f"distribution.world_size={world}",
                    f"tf.strategy={strategy}",
                ]
                tag = f"{name}-w{world}-{strategy}"
                # As compare --config makes them: the fp64 torch run records the probe states, the
                # requested-precision runs replay them.
                ref = [
                    run(
                        base / f"{tag}-fp64-{b}",
                        b,
                        config,
                        [*common, "precision.dtype=fp64"],
                        probes.RECORD if b == "torch" else None,
                    )
                    for b in ("torch", "tf")
                ]
                for p in PRECISIONS:
                    a, b = (
                        run(
                            base / f"{tag}-{p}-{x}",
                            x,
                            config,
                            [*common, f"precision.dtype={p}"],
                            probes.replay(ref[0]),
                        )
                        for x in ("torch", "tf")
                    )
                    cmp = compare_dirs(a, b, tuple(ref))
                    c = {k.name: k for k in cmp.checks}
                    verdict = "PASS" if cmp.passed else f"**FAIL** ({cmp.diagnosis.summary()})"
                    bad += not cmp.passed
                    rows.append(
                        f"| {name} | {world} | {strategy} | {p} | {verdict} | "
                        f"{c['reference_loss'].value:.1e} / {c['reference_weights'].value:.1e} | "
                        f"{c['trajectory'].value:.2f}x | {c['final_weights'].value:.2f}x | "
                        f"{c['eval'].value:.2f} pp (<= {c['eval'].tolerance:.2g}) | "
                        f"{c['local_loss'].value:.2f} / {c['local_grad'].value:.2f} / "
                        f"{c['local_update'].value:.2f} | {c['convergence'].value:.1f} pp "
                        f"(<= {c['convergence'].tolerance:g}) |"
                    )
                    print(rows[-1], flush=True)
    text = "\n".join(rows) + f"\n\n({time.perf_counter() - t0:.0f} s, runs in {base})\n"
    (base / "compare_matrix.md").write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
