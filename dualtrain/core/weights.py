"""Initial weights, generated once in NumPy and loaded into both backends.

Layout: the canonical layout of :mod:`dualtrain.core.model` (PyTorch ``nn.Sequential`` state dict).
Initial weights are float32 (an fp64 run starts from the same float32 values, exactly widened); a
weights file holds float32 or float64 arrays (an fp64 run's final weights and gradients stay
float64). Distribution: PyTorch's default for Linear and Conv2d, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
for weights and biases, drawn from ``numpy.random.Generator(PCG64(SeedSequence([seed, 0x57])))`` in
layer order, weight before bias, in float64 then rounded to float32 (a residual block's layers in
canonical order: body, then shortcut); each layer type declares its arrays' init
(dualtrain.spec.layers: attention's as torch's nn.MultiheadAttention, a position embedding
N(0, 0.02^2)). BatchNorm and LayerNorm start as torch's do and draw nothing: weight 1,
bias 0, running_mean 0, running_var 1. Neither framework's RNG is involved, so the
same seed gives bit-identical starting points in PyTorch and TensorFlow.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.model import param_shapes, resolve, walk
from dualtrain.errors import UserError
from dualtrain.records.record import WEIGHTS_INIT
from dualtrain.spec import ModelSpec

_WEIGHTS_STREAM = 0x57  # keeps the weight stream independent of any other use of the seed

Weights = dict[str, np.ndarray]


def init_weights(model: ModelSpec, seed: int) -> Weights:
    """Every array as its layer type declares it (dualtrain.spec.layers): drawn from the weight
    stream in canonical order, or a constant (no draw)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _WEIGHTS_STREAM])))
    out: Weights = {}
    for layer in walk(resolve(model)):
        for a in layer.declared:
            how, value = a.init
            if how == "const":
                out[a.name] = np.full(a.shape, value, np.float32)
            elif how == "uniform":
                out[a.name] = rng.uniform(-value, value, size=a.shape).astype(np.float32)
            else:  # normal
                out[a.name] = rng.normal(0.0, value, size=a.shape).astype(np.float32)
    return out


def initial_weights(model: ModelSpec, seed: int) -> Weights:
    """The run's initial weights: ``model.init_from`` if set, else generated from the seed."""
    if model.init_from is None:
        return init_weights(model, seed)
    weights = load_weights(model.init_from)
    check_layout(weights, model, source=model.init_from)
    return weights


def worker_initial_weights(model: ModelSpec, seed: int, run_dir: str | Path | None) -> Weights:
    """What a worker starts from: the run directory's weights_init.npz (written before launch), or,
    for a rank with no run directory (external launcher, not the chief), the same arrays
    regenerated."""
    path = Path(run_dir) / WEIGHTS_INIT if run_dir is not None else None
    if path is not None and path.is_file():
        return load_weights(path)
    if model.is_pair:
        raise UserError(
            "a model pair's workers read its initial weights and weight map from the run "
            "directory, which this rank does not see; give every rank the run directory "
            f"(a shared folder). Received: run directory {run_dir}"
        )
    return initial_weights(model, seed)


def check_layout(weights: Weights, model: ModelSpec, source: str = "weights") -> None:
    if model.is_pair:  # the layout is the torch module's (dualtrain.core.pair, model_pair.json)
        return
    check_shapes(weights, param_shapes(model), source)


def check_shapes(
    weights: Weights, expected: dict[str, tuple[int, ...]], source: str = "weights"
) -> None:
    if set(weights) != set(expected):
        missing = sorted(set(expected) - set(weights))
        extra = sorted(set(weights) - set(expected))
        raise UserError(
            f"{source}: parameters do not match the model (missing {missing}, unexpected "
            f"{extra}). Received: {sorted(weights)}"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise UserError(
                f"{source}: {name} must have shape {shape}. Received: {tuple(weights[name].shape)}"
            )


def _storage_dtype(array: np.ndarray) -> type:
    """float64 stays float64 (fp64 runs); everything else is stored as float32."""
    return np.float64 if np.asarray(array).dtype == np.float64 else np.float32


def save_weights(path: str | Path, weights: Weights) -> None:
    save_arrays(
        path, {k: np.ascontiguousarray(v, dtype=_storage_dtype(v)) for k, v in weights.items()}
    )


def save_arrays(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as an .npz at ``path``, each in its own dtype, replacing the file at once."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    # Any: mypy also matches **arrays against savez's allow_pickle: bool parameter
    named: dict[str, Any] = arrays
    np.savez(tmp, **named)
    tmp.replace(path)


def load_weights(path: str | Path) -> Weights:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"weights file not found: {str(p)!r}")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k].astype(_storage_dtype(data[k]), copy=False) for k in data.files}
    except (OSError, ValueError) as exc:
        raise UserError(f"{p}: not a readable .npz weights file ({exc})") from None


def weights_digest(weights: Weights) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        a = weights[name]
        h.update(name.encode())
        h.update(
            np.ascontiguousarray(
                a, dtype="<f8" if _storage_dtype(a) is np.float64 else "<f4"
            ).tobytes()
        )
    return h.hexdigest()[:16]
