"""Parity suite fixtures: real runs of both backends, each in its own worker processes.

``runs`` starts a run once per (backend, overrides) for the whole session and hands back its run
directory, so tests that need the same run (the 2-epoch MLP for convergence and trajectory, say)
share it. This process never imports torch or TensorFlow: ``start_run`` launches workers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dualtrain.backends import parse_backend
from dualtrain.compare.backends import twin_element, twin_world_size
from dualtrain.record import WEIGHTS_INIT, read_run
from dualtrain.runs import start_run
from dualtrain.spec import load_spec
from dualtrain.weights import load_weights, perturb_ulp, save_weights

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "configs" / "mnist_mlp.yaml")


class Runs:
    def __init__(self, base: Path):
        self.base = base
        self._cache: dict[tuple, Path] = {}

    def __call__(self, backend: str, *overrides: str, config: str = MLP) -> Path:
        key = (backend, config, overrides)
        if key not in self._cache:
            tag = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
            out = self.base / f"{backend}-{tag}"
            spec = load_spec(config, ["train.log_every=1000000", *overrides])
            start_run(spec, parse_backend(backend), out, overwrite=True)
            self._cache[key] = out
        return self._cache[key]

    def twin(self, of: Path, backend: str, *overrides: str, config: str = MLP) -> Path:
        """The noise-floor twin, built as ``dualtrain compare`` builds it (same noise floor in the suite
        and the report): initial weights moved by one ulp in one element, global batches split over
        another number of replicas."""
        init = self.base / f"twin-init-{of.name}.npz"
        if not init.exists():
            weights = load_weights(of / WEIGHTS_INIT)
            save_weights(init, perturb_ulp(weights, *twin_element(weights)))
        world = twin_world_size(load_spec(config, list(overrides)))
        return self(backend, *overrides, f"model.init_from={init}", f"distribution.world_size={world}",
                    config=config)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("parity-runs"))


def train_losses(run_dir: Path) -> list[float]:
    return [float(r["loss"]) for r in read_run(run_dir).train]
