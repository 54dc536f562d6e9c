"""The parity suite's runs: real runs of both backends, each in its own worker processes.

``Runs`` (parity_tests' session fixture ``runs``) starts a run once per (backend, overrides) for
the whole session and hands back its run directory, so tests that need the same run (the 2-epoch
MLP for convergence and trajectory, say) share it. This process never imports torch or TensorFlow:
``start_run`` launches workers.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dualtrain.backends import parse_backend
from dualtrain.driver.runs import start_run
from dualtrain.parity.checks import (
    Reference,
    check_reference_eval,
    check_reference_loss,
    check_reference_weights,
)
from dualtrain.records.record import read_run
from dualtrain.runtime import probes
from dualtrain.spec import dump_spec, load_spec
from testkit.cli import ROOT
from testkit.shared import once

MLP = str(ROOT / "configs" / "mnist_mlp.yaml")


class Runs:
    def __init__(self, base: Path):
        self.base = base
        self._cache: dict[tuple, Path] = {}

    def __call__(
        self,
        backend: str,
        *overrides: str,
        config: str = MLP,
        env: dict[str, str] | None = None,
        probe: probes.Role | None = None,
    ) -> Path:
        """The run's directory; ``env``: extra environment for its workers (the mutants' test hook);
        ``probe``: its part in the one-step probes (dualtrain.runtime.probes), as compare sets
        it."""
        spec = load_spec(config, ["train.log_every=1000000", *overrides])
        # keyed by the resolved spec, so tests that reach the same run by other overrides (another
        # order, a default spelled out) share it
        key = (backend, dump_spec(spec), tuple(sorted((env or {}).items())), probe)
        if key not in self._cache:
            tag = hashlib.sha1(repr(key).encode()).hexdigest()[:10]

            def build(out: Path) -> None:
                saved = {k: os.environ.get(k) for k in (env or {})}
                os.environ.update(env or {})
                try:
                    start_run(spec, parse_backend(backend), out, overwrite=True, probe=probe)
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v

            out = once(self.base / f"{backend}-{tag}", build)
            self._cache[key] = out
        return self._cache[key]

    def resume_from(self, backend: str, ckpt: Path, *overrides: str, config: str = MLP) -> Path:
        """A new ``backend`` run of the spec that continues checkpoint ``ckpt`` (--resume-from)."""
        key = ("resume_from", backend, str(ckpt), config, overrides)
        if key not in self._cache:
            tag = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
            spec = load_spec(config, ["train.log_every=1000000", *overrides])
            self._cache[key] = once(
                self.base / f"{backend}-from-{tag}",
                lambda out: start_run(
                    spec, parse_backend(backend), out, overwrite=True, resume_from=ckpt
                ),
            )
        return self._cache[key]

    def reference(self, *overrides: str, config: str = MLP) -> Reference:
        """The fp64 reference pair of a spec, built as ``dualtrain compare`` builds it: the same
        overrides with ``precision.dtype=fp64``, on torch and on tf."""
        ref = (*overrides, "precision.dtype=fp64")
        return Reference(
            read_run(self("torch", *ref, config=config)), read_run(self("tf", *ref, config=config))
        )


def train_losses(run_dir: Path) -> list[float]:
    return [float(r["loss"]) for r in read_run(run_dir).train]


def assert_reference_agrees(ref: Reference) -> None:
    """The fp64 pair's three reference checks (loss, weights, evaluation) pass."""
    for check in (
        check_reference_loss(ref),
        check_reference_weights(ref),
        check_reference_eval(ref),
    ):
        print(check.name, check.detail)
        assert check.passed, check.detail
