"""Every check of a run that can be made before anything is written or launched: the spec against
the backend and the data, batch sizes against world size, the output folder. :func:`validate`
is shared by the run and its dry run (through :func:`dualtrain.driver.runs.resolve_run`)."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from dualtrain.backends import check_installed, launch_module
from dualtrain.core import data as data_mod
from dualtrain.core.model import batchnorm_layers, cancelled_biases, resolve, walk, where
from dualtrain.core.pair.record import Layout
from dualtrain.core.plan import ShardPlan, micro_sizes
from dualtrain.core.weights import initial_weights
from dualtrain.driver.outdir import check_creatable
from dualtrain.driver.pair import pair_layout
from dualtrain.errors import UserError
from dualtrain.records import tbevents
from dualtrain.records.record import SPEC_FILE
from dualtrain.runtime.start import steps_total
from dualtrain.spec import OPTIMIZERS, Backend, Device, Experiment, LayerType, Strategy

_CHECKED: dict[str, data_mod.Data] = {}
"""Data checked in this process, by the spec's data and model inputs (compare validates four runs
of one spec: the data's content is read and hashed once)."""


def checked_data(spec: Experiment, width: int | None = None) -> data_mod.Data:
    """:func:`dualtrain.core.data.check`, once per process for the same data and model (a file
    changed since, by size or mtime, is checked again)."""
    stamp = data_mod.stamp(spec, data_mod.locate(spec))
    key = repr((spec.data, spec.model, spec.seed, stamp))
    if key not in _CHECKED:
        _CHECKED[key] = data_mod.check(spec, width=width)
    return _CHECKED[key]


@dataclass(frozen=True)
class Validated:
    """What :func:`validate` found: the checked data, and what to warn about before the run
    (said by the caller, once: compare validates both backends' runs of one spec)."""

    data: data_mod.Data
    warnings: tuple[str, ...] = ()


def say_warnings(warnings: Iterable[str], said: Collection[str] = ()) -> None:
    """Each warning once, as ``dualtrain: warning: ...`` on stderr, but those in ``said``."""
    for text in dict.fromkeys(warnings):
        if text not in said:
            print(f"dualtrain: warning: {text}", file=sys.stderr, flush=True)


def validate(spec: Experiment, backend: Backend) -> Validated:
    """Every check of a run made before any worker starts (the run and its --dry-run share them):
    model shapes, the data against the model (its content checked: another dataset in
    data.data_dir is refused here; the checked data is returned),
    init weights, batches batchnorm can normalise, the device (a child process asks the framework
    whether a gpu run has a GPU). Prints nothing: the warnings are returned."""
    check_installed(backend)
    check_strategy(spec, backend)
    if spec.logging.tensorboard and not tbevents.available():
        raise UserError(
            "logging.tensorboard needs the tensorboard package (pip install tensorboard; "
            "it does not need TensorFlow), or set logging.tensorboard: false. Received: "
            "tensorboard not installed"
        )
    if spec.model.is_pair:  # the user's modules, described by each backend (driver.pair)
        layout, _ = pair_layout(spec)
        check_strategy(spec, backend, layout)  # what the pair holds decides it too
        data = checked_data(spec, layout.output_width)
    else:
        resolve(spec.model)
        data = checked_data(spec)
        initial_weights(spec.model, spec.seed)  # checks init_from's layout
    n_train = data.size(data_mod.TRAIN)
    check_split_sizes(spec, data)
    if spec.model.is_pair:
        check_batchnorm_batches(spec, n_train, pair_batchnorms(layout))
        warnings = cancelled_bias_warnings(spec, pair_cancelled_biases(layout))
    else:
        check_batchnorm_batches(spec, n_train)
        warnings = cancelled_bias_warnings(spec)
    warnings += check_sizes(spec, n_train)
    launch_module(backend).check_devices(spec)
    return Validated(data, tuple(warnings))


def check_strategy(spec: Experiment, backend: Backend, layout: Layout | None = None) -> None:
    """distribution.strategy: parameter_server is built for CPU runs (docs/strategies.md says
    what is left): on TF without batchnorm so far (a model pair's: known from its ``layout``, once
    described); anything else is refused here."""
    if spec.distribution.strategy is not Strategy.PARAMETER_SERVER:
        return
    what = None
    norms = pair_batchnorms(layout) if layout is not None else []
    if backend is Backend.TF and norms:
        what = (
            f"a model pair's batchnorm on the tf backend ({norms[0][0]}: replica 0's statistics "
            f"are not sent back yet)"
        )
    elif (
        backend is Backend.TF
        and not spec.model.is_pair
        and any(r.spec.type is LayerType.BATCHNORM for r in walk(resolve(spec.model)))
    ):
        what = "batchnorm on the tf backend (replica 0's statistics are not sent back yet)"
    elif spec.distribution.device is Device.GPU:
        what = "device: gpu (the server runs on CPU only so far)"
    if what is not None:
        raise UserError(
            f"distribution.strategy: parameter_server is not available with {what}; use "
            f"all_reduce, the same step (docs/strategies.md). Received: parameter_server"
        )


def check_split_sizes(spec: Experiment, data: data_mod.Data) -> None:
    """With data.last_batch: drop no replica is meant to go without samples: a split (train,
    validation or test) smaller than the world size is refused."""
    world = spec.distribution.world_size
    if spec.data.last_batch.value != "drop":
        return
    for split in (data_mod.TRAIN, data_mod.VALIDATION, data_mod.TEST):
        n = data.size(split)
        if 0 < n < world:
            raise UserError(
                f"the {split} split has {n} sample(s), fewer than the {world} replicas, with "
                f"data.last_batch: drop (every replica needs a sample); use fewer replicas or "
                f"more data. Received: {n} {split} sample(s), world_size {world}"
            )


def check_sizes(spec: Experiment, num_train: int) -> list[str]:
    """Refuse a setup that cannot train (no step at all); the warning for one that trains with
    replicas that never get a sample (world size above the global batch or the samples)."""
    plan = ShardPlan.from_spec(spec, num_train)
    world, batch = spec.distribution.world_size, plan.global_batch  # accumulate x batch_size
    k = spec.train.accumulate
    got = (
        f"Received: world_size {world}, data.batch_size {spec.data.batch_size}"
        + (f", train.accumulate {k}" if k > 1 else "")
        + f", {num_train} training sample(s), data.last_batch {spec.data.last_batch.value}"
    )
    if plan.steps_per_epoch == 0:
        raise UserError(
            f"no training step: the global batch ({batch}) is larger than the "
            f"{num_train} training sample(s) and data.last_batch: drop drops it; use "
            f"data.last_batch: keep or a smaller batch. {got}"
        )
    busy = min(batch, num_train)  # the most samples any step holds
    if world > busy:
        return [
            f"{world - busy} of the {world} replicas get no sample at any step (a step holds "
            f"at most {busy} sample(s)); they only take part in the collectives. Use "
            f"--world-size {busy} or less. {got}"
        ]
    if batch > num_train:
        return [
            f"the global batch ({batch}) is larger than the {num_train} training "
            f"sample(s): every epoch is one step of {num_train}. {got}"
        ]
    return []


def cancelled_bias_warnings(
    spec: Experiment, found: list[tuple[str, str, str]] | None = None
) -> list[str]:
    """A bias right before a batchnorm has an exactly-zero gradient; what is computed is rounding
    noise, which Adam-like optimizers divide by eps into real updates that differ between any two
    implementations. Training is unaffected, but the fp64 reference pair sees those tensors differ
    (docs/parity.md §9), so say so before the run, with the fix. ``found``: (layer, its kind, the
    batchnorm) of a model pair (pair_cancelled_biases); a spec's own layers otherwise."""
    if not OPTIMIZERS[spec.optimizer.name].normalises:
        return []
    if found is None:
        found = [
            (where(layer.prefix), layer.spec.type.value, where(norm.prefix))
            for layer, norm in cancelled_biases(spec.model)
        ]
    return [
        f"{layer} ({kind}) feeds the batchnorm {norm}, which cancels its bias (zero gradient); "
        f"under {spec.optimizer.name.value} rounding noise moves it, and the fp64 reference pair "
        f"may report that bias and the batchnorm's running_mean "
        + (
            f"as differing. Set bias=False / use_bias=False for {layer} on both sides."
            if spec.model.is_pair
            else f"as differing. Set bias: false on {layer}."
        )
        for layer, kind, norm in found
    ]


def pair_cancelled_biases(layout: Layout) -> list[tuple[str, str, str]]:
    """A model pair's (torch module, kind, batchnorm) where a dense or conv layer with a bias is
    the module the torch forward calls right before a batchnorm."""
    biased = {a.module for a in layout.torch.torch if a.name.endswith(".bias") and a.trainable}
    calls = list(layout.torch.layers)
    return [
        (f"model.torch's {prev['name']!r}", prev.get("kind", ""), repr(nxt["name"]))
        for prev, nxt in zip(calls, calls[1:], strict=False)
        if nxt.get("kind") == "batchnorm" and prev.get("name") in biased
    ]


def pair_batchnorms(layout: Layout) -> list[tuple[str, bool, int]]:
    """A model pair's batchnorm layers: (what to call it, sync, values per channel per sample)."""
    out = []
    for d in layout.torch.layers:
        if d.get("kind") == "batchnorm" and d.get("in"):
            per_sample = 1
            for n in d["in"][0][1:]:
                per_sample *= n
            out.append(
                (f"model.torch's {d['name']!r} ({d.get('cls', 'batchnorm')})", False, per_sample)
            )
    return out


def check_batchnorm_batches(
    spec: Experiment, num_train: int, found: list[tuple[str, bool, int]] | None = None
) -> None:
    """Refuse, before any process starts, a step where a batchnorm layer would normalise over fewer
    than 2 values per channel: on one replica (sync: false) or over the global batch (sync: true).
    Batch sizes repeat every epoch and only the last step of an epoch can be smaller, so the first
    and last steps of the first epoch decide. ``found``: a model pair's batchnorms
    (pair_batchnorms); the spec's own layers otherwise."""
    if found is None:
        found = [
            (
                f"{where(r.prefix)} (batchnorm, sync: {str(r.spec.sync).lower()})",
                bool(r.spec.sync),
                per_sample,
            )
            for r, per_sample in batchnorm_layers(spec.model)
        ]
    if not found:
        return
    plan = ShardPlan.from_spec(spec, num_train)
    total = steps_total(spec, plan)
    last = plan.steps_per_epoch - 1
    for k in sorted({0, last}):
        if k >= total:
            continue
        # with train.accumulate: what one forward normalises over is a micro-batch
        micro = [micro_sizes(n, plan.accumulate) for n in plan.step_sizes(k)]
        for what, sync, per_sample in found:
            at = f"at step {k + 1}{' (the last of every epoch)' if k == last and k else ''}"
            got = (
                f"Received: batch_size {spec.data.batch_size}, world_size {plan.world_size}, "
                + (f"train.accumulate {plan.accumulate}, " if plan.accumulate > 1 else "")
                + f"{num_train} train samples, last_batch {spec.data.last_batch.value}"
            )
            if sync:
                n = min(sum(m[j] for m in micro) for j in range(plan.accumulate))
                if n * per_sample < 2:
                    raise UserError(
                        f"{what}: {at} the global batch holds {n} sample(s){_micro(plan)}, "
                        f"{n * per_sample} value(s) per channel; batchnorm needs at least "
                        f"2. Use data.last_batch: drop. {got}"
                    )
                continue
            replica = min(range(len(micro)), key=lambda i: min(micro[i]))
            n = min(micro[replica])
            if n * per_sample < 2:
                fix = (
                    "data.last_batch: drop or another batch size"
                    if spec.model.is_pair
                    else "sync: true (statistics over the global batch) or data.last_batch: drop"
                )
                raise UserError(
                    f"{what}: {at} replica {replica} holds {n} sample(s){_micro(plan)}, "
                    f"{n * per_sample} value(s) per channel; batchnorm needs at least 2. "
                    f"Use {fix}. {got}"
                )


def _micro(plan: ShardPlan) -> str:
    return " in a micro-batch (train.accumulate)" if plan.accumulate > 1 else ""


def check_out_dir(path: Path, overwrite: bool) -> bool:
    """Refuse an --out the run may not use (nothing stays written); True if it holds a run
    --overwrite replaces."""
    if path.exists() and not path.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(path)!r}")
    check_creatable(path)
    if path.is_dir() and any(path.iterdir()):
        if not (path / SPEC_FILE).is_file():
            raise UserError(
                f"--out is a non-empty folder that is not a dualtrain run; choose another. "
                f"Received: {str(path)!r}"
            )
        if not overwrite:
            raise UserError(
                f"--out already holds a run; pass --overwrite or choose another folder. "
                f"Received: {str(path)!r}"
            )
        return True
    return False
