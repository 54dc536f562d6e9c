"""Synthetic run directories for the compare tests: real files in the run-directory contract,
written with dualtrain.records.record.RunWriter and dualtrain.core.weights.save_weights (data
fixtures, no framework)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.losses import LOSSES
from dualtrain.core.weights import Weights, init_weights, save_weights
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_FINAL, WEIGHTS_INIT, RunWriter
from dualtrain.spec import dump_spec, from_dict

TINY_MODEL = {
    "layers": [
        {"type": "flatten"},
        {"type": "dense", "units": 16},
        {"type": "relu"},
        {"type": "dense", "units": 10},
    ]
}
WORLD = 2


def base_spec(**changes: Any) -> dict[str, Any]:
    raw = {
        "name": "synth",
        "seed": 0,
        "model": copy.deepcopy(TINY_MODEL),  # changes to model.* must not reach the next spec
        "distribution": {"world_size": WORLD},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"epochs": 1},
        "data": {"batch_size": 64},
    }
    for dotted, value in changes.items():
        node = raw
        parts = dotted.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return raw


def base_loss(step: int) -> float:
    return 0.3 + 2.0 * math.exp(-step / 40.0) + 0.05 * math.sin(step * 1.7)


def digest(step: int, replica: int, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}{step}:{replica}".encode()).hexdigest()[:16]


def make_run(
    path: Path,
    *,
    backend: str = "torch",
    steps: int = 120,
    spec: dict[str, Any] | None = None,
    loss: Callable[[int], float] = base_loss,
    lr: Callable[[int], float] = lambda s: 0.05,
    loss_scale: Callable[[int], float] = lambda s: 1.0,
    skipped: Callable[[int], bool] = lambda s: False,
    shard_salt: Callable[[int], str] = lambda s: "",
    init: Weights | None = None,
    final_delta: float = 1e-2,
    final_noise: float = 0.0,
    noise_seed: int = 1,
    accuracy: Callable[[int], float] = lambda s: 0.9,
    eval_every: int = 40,
    samples_per_s: float = 10000.0,
    grads: dict[int, Weights] | None = None,
    grad_amax: Callable[[int], float] | None = None,
) -> Path:
    """Write a finished run directory. Every series is a function of the (1-based) step."""
    path = Path(path)
    spec_obj = from_dict(spec or base_spec())
    path.mkdir(parents=True, exist_ok=True)
    (path / SPEC_FILE).write_text(dump_spec(spec_obj))
    w0 = init if init is not None else init_weights(spec_obj.model, spec_obj.seed)
    save_weights(path / WEIGHTS_INIT, w0)
    rng = np.random.default_rng(noise_seed)
    # A fixed "training" update shared by every run, plus optional run-specific noise.
    # An fp64 run's final weights are float64 (as the backends write them).
    dt = np.float64 if spec_obj.precision.dtype.value == "fp64" else np.float32
    final = {
        k: v.astype(dt)
        + dt(final_delta) * np.cos(np.arange(v.size, dtype=dt)).reshape(v.shape)
        + dt(final_noise) * rng.standard_normal(v.shape).astype(dt)
        for k, v in w0.items()
    }
    save_weights(path / WEIGHTS_FINAL, final)
    for s, g in (grads or {}).items():
        save_weights(path / f"grads_step{s}.npz", g)
    w = RunWriter(path)
    batch = spec_obj.data.batch_size
    for s in range(1, steps + 1):
        amax = {} if grad_amax is None else {"grad_amax": grad_amax(s)}
        w.train(
            step=s,
            epoch=1,
            loss=loss(s),
            lr=lr(s),
            grad_norm=1.0,
            loss_scale=loss_scale(s),
            skipped=bool(skipped(s)),
            samples=batch,
            samples_per_s=samples_per_s,
            **amax,
        )
        for r in range(WORLD):
            w.shard(
                step=s, epoch=1, replica=r, digest=digest(s, r, shard_salt(s)), count=batch // WORLD
            )
        if s % eval_every == 0 or s == steps:
            w.eval(step=s, epoch=1, loss=loss(s), accuracy=accuracy(s), count=1000)
    w.summary(
        {
            "backend": backend,
            "name": spec_obj.name,
            "world_size": WORLD,
            "precision": spec_obj.precision.dtype.value,
            "steps": steps,
            "train_samples_per_s": samples_per_s,
            "test_loss": loss(steps),
            "test_accuracy": accuracy(steps),
            "test_count": 1000,
            "versions": {"python": "3", "numpy": np.__version__, backend: "synthetic"},
        }
    )
    w.close()
    return path


def fp64_spec(**changes: Any) -> dict[str, Any]:
    return base_spec(precision={"dtype": "fp64"}, **changes)


def quad(
    root: Path,
    *,
    a_loss: Callable[[int], float] | None = None,
    b_loss: Callable[[int], float] | None = None,
    ref_b_loss: Callable[[int], float] | None = None,
    **b_kwargs: Any,
) -> tuple[Path, ...]:
    """A (torch fp32), B (tf fp32) and their fp64 reference pair: the fp64 runs agree to ~1e-15,
    each fp32 run drifts from its fp64 run by ~1e-4 (growing), like real runs do."""
    ra = make_run(
        root / "ref_a", spec=fp64_spec(), loss=noisy(1e-15, 11), final_noise=1e-15, noise_seed=11
    )
    rb = make_run(
        root / "ref_b",
        backend="tf",
        spec=fp64_spec(),
        loss=ref_b_loss or noisy(1e-15, 12),
        final_noise=1e-15,
        noise_seed=12,
    )
    a = make_run(
        root / "a", loss=a_loss or noisy(1e-5, 1, grow=0.02), final_noise=1e-5, noise_seed=1
    )
    b = make_run(
        root / "b",
        backend="tf",
        loss=b_loss or noisy(1e-5, 2, grow=0.02),
        final_noise=1e-5,
        noise_seed=2,
        **b_kwargs,
    )
    return a, b, ra, rb


def noisy(scale: float, seed: int, grow: float = 0.0) -> Callable[[int], float]:
    """base_loss plus a deterministic perturbation of size ~scale * exp(grow * step)."""

    def f(step: int) -> float:
        u = np.random.default_rng([seed, step]).uniform(-1.0, 1.0)
        return base_loss(step) + scale * math.exp(grow * step) * float(u)

    return f


def add_probes(
    ref: Path,
    runs: dict[Path, dict[str, Any]],
    steps: tuple[int, ...] = (1, 40, 80),
    seed: int = 5,
    sensitivity: dict[str, float] | None = None,
) -> None:
    """One-step probes (dualtrain.runtime.probes) for synthetic runs: ``ref`` (fp64) records states;
    each run in ``runs`` replays them with relative errors ``{"loss": e, "grad": e, "update": e}``
    (an error of float32 rounding size where not given; ``loss`` may be a function of the step),
    and its loss path off its own outputs' exact loss by ``own`` (relative; 0 where not given). The
    runs' summaries name ``ref`` as the source. ``sensitivity``: the fp64 run's recorded loss
    sensitivity per kind of product (dualtrain.core.kernels)."""
    from dualtrain.core import optim_ref
    from dualtrain.runtime import probes

    spec = from_dict(base_spec())
    rng = np.random.default_rng(seed)
    shapes = {"0.weight": (6, 5), "0.bias": (6,)}
    ref_rows, rows = [], {run: [] for run in runs}
    u = 2.0**-24
    for s in steps:
        pre = {k: rng.standard_normal(v) for k, v in shapes.items()}
        slots = {f"momentum_buffer/{k}": rng.standard_normal(v) * 0.1 for k, v in shapes.items()}
        g64 = {k: rng.standard_normal(v) * 0.1 for k, v in shapes.items()}
        applied = s - 1
        sl = slots if applied else {}
        lr = 0.05
        opt = spec.optimizer
        post64 = optim_ref.step(opt, lr, pre, sl, applied, g64)
        probes.save(ref, s, {"pre": pre, "slot": sl, "grad": g64, "post": post64})
        ref_rows.append(
            {
                "step": s,
                "loss": 1.0,
                "lr": lr,
                "grad_norm": 1.0,
                "loss_scale": 1.0,
                "skipped": False,
                "count": 64,
                "applied": applied,
                "loss_abs": 1.0,
                **({"sensitivity": sensitivity} if sensitivity else {}),
            }
        )
        for run, err in runs.items():

            def noise(v, e):
                return v * (1.0 + e * rng.choice([-1.0, 1.0], size=np.shape(v)))

            g = {k: noise(v, err.get("grad", 4 * u)).astype(np.float32) for k, v in g64.items()}
            pre32 = {k: v.astype(np.float32).astype(np.float64) for k, v in pre.items()}
            sl32 = {k: v.astype(np.float32).astype(np.float64) for k, v in sl.items()}
            exact = optim_ref.step(
                opt, lr, pre32, sl32, applied, {k: v.astype(np.float64) for k, v in g.items()}
            )
            e_upd = err.get("update", 0.0)
            post = {k: (v + e_upd * (v - pre32[k])).astype(np.float32) for k, v in exact.items()}
            probes.save(run, s, {"grad": g, "post": post})
            e_loss = err.get("loss", 2 * u)
            loss = 1.0 + (e_loss(s) if callable(e_loss) else e_loss)
            rows[run].append(
                {
                    "step": s,
                    "loss": loss,
                    "own_loss": loss * (1.0 - err.get("own", 0.0)),
                    "lr": lr,
                    "grad_norm": 1.0,
                    "loss_scale": 1.0,
                    "skipped": False,
                    "count": 64,
                }
            )
    probes.write_index(ref, ref_rows)
    note_probes(ref, {"mode": "record", "steps": len(ref_rows), "source": ""})
    for run, r in rows.items():
        probes.write_index(run, r)
        note_probes(run, {"mode": "replay", "steps": len(r), "source": str(ref)})


def note_probes(run: Path, probes: dict[str, Any]) -> None:
    """summary.json's ``probes``: the run's part in the one-step probes."""
    path = Path(run) / SUMMARY_FILE
    summary = json.loads(path.read_text())
    summary["probes"] = probes
    path.write_text(json.dumps(summary))


def set_kernels(run: Path, dtype: str, directed: dict[str, float]) -> None:
    """A run's kernel calibration in its summary (dualtrain.core.kernels): ``directed`` per kind."""
    path = Path(run) / SUMMARY_FILE
    summary = json.loads(path.read_text())
    cal = {
        k: {
            "directed": d,
            "rms": 0.43,
            "rounding": "to nearest" if d == 0 else "toward zero",
            "nearest_share": 1.0 if d == 0 else 0.5,
        }
        for k, d in directed.items()
    }
    summary["kernels"] = {"static": {}, "measured": {dtype: cal}}
    path.write_text(json.dumps(summary))


def one_ulp_moved(weights):
    """``weights`` with its first array's first value moved up by one float32 ulp."""
    out = {k: v.copy() for k, v in weights.items()}
    first = sorted(out)[0]
    flat = out[first].reshape(-1)
    flat[0] = np.nextafter(flat[0], np.float32(np.inf), dtype=np.float32)
    return out


def loss_batch(loss: Any, seed: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 outputs (n, k) and targets the loss takes (dualtrain.core.losses.LOSSES): int64
    labels 0..k-1, or values (n, k) in the loss's target range (-k..k where it has none)."""
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, k)) * k
    if LOSSES[loss].labels:
        return out, rng.integers(0, k, n)
    lo, hi = LOSSES[loss].target_range or (-float(k), float(k))
    return out, rng.uniform(lo, hi, (n, k))
