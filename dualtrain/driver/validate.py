"""Every check of a run that can be made before anything is written or launched: the spec against
the backend and the data, batch sizes against world size, the output folder. :func:`validate`
is shared by the run and its dry run (through :func:`dualtrain.driver.runs.resolve_run`)."""

from __future__ import annotations

import sys
from pathlib import Path

from dualtrain.backends import check_installed, launch_module
from dualtrain.core import data as data_mod
from dualtrain.core.model import batchnorm_layers, cancelled_biases, resolve, where
from dualtrain.core.plan import ShardPlan
from dualtrain.core.weights import initial_weights
from dualtrain.driver.outdir import check_creatable
from dualtrain.driver.pair import pair_layout
from dualtrain.errors import UserError
from dualtrain.records import tbevents
from dualtrain.records.record import SPEC_FILE
from dualtrain.runtime.start import steps_total
from dualtrain.spec import Backend, Experiment

_WARNED: set[tuple[str, str]] = set()  # what this process already warned about


_CHECKED: dict[str, data_mod.Data] = {}
"""Data checked in this process, by the spec's data and model inputs (compare validates four runs
of one spec: the data's content is read and hashed once)."""


def checked_data(spec: Experiment, width: int | None = None) -> data_mod.Data:
    """:func:`dualtrain.core.data.check`, once per process for the same data and model (a file
    changed since, by size or mtime, is checked again)."""
    source = data_mod.locate(spec)
    kind, _, where = source.partition(":")
    stamp = ""
    if kind == "arrays":
        p = Path(where).expanduser()
        files = sorted(p.glob("*.npy")) if p.is_dir() else [p]
        stamp = ";".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    key = repr((spec.data, spec.model, spec.seed, stamp))
    if key not in _CHECKED:
        _CHECKED[key] = data_mod.check(spec, width=width)
    return _CHECKED[key]


def validate(spec: Experiment, backend: Backend) -> data_mod.Data:
    """Every check of a run made before any worker starts (the run and its --dry-run share them):
    model shapes, the data against the model (its content checked: another dataset in
    data.data_dir is refused here; the checked data is returned),
    init weights, batches batchnorm can normalise, the device (a child process asks the framework
    whether a gpu run has a GPU)."""
    check_installed(backend)
    if spec.logging.tensorboard and not tbevents.available():
        raise UserError(
            "logging.tensorboard needs the tensorboard package (pip install tensorboard; "
            "it does not need TensorFlow), or set logging.tensorboard: false. Received: "
            "tensorboard not installed"
        )
    if spec.model.is_pair:  # the user's modules, described by each backend (driver.pair)
        layout, _ = pair_layout(spec)
        data = checked_data(spec, layout.output_width)
    else:
        resolve(spec.model)
        data = checked_data(spec)
        initial_weights(spec.model, spec.seed)  # checks init_from's layout
    n_train = data.size(data_mod.TRAIN)
    check_split_sizes(spec, data)
    if not spec.model.is_pair:
        check_batchnorm_batches(spec, n_train)
        warn_cancelled_biases(spec)
    check_sizes(spec, n_train)
    launch_module(backend).check_devices(spec)
    return data


#: Optimizers whose step divides by a running gradient magnitude (plus eps).
_NORMALISING = ("adam", "adamw", "adadelta", "rmsprop")


def _warn_once(key: tuple[str, str], text: str) -> None:
    if key in _WARNED:  # compare validates four runs of one spec: say it once
        return
    _WARNED.add(key)
    print(f"dualtrain: warning: {text}", file=sys.stderr, flush=True)


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


def check_sizes(spec: Experiment, num_train: int) -> None:
    """Refuse a setup that cannot train (no step at all); warn once about one that trains with
    replicas that never get a sample (world size above the global batch or the samples)."""
    plan = ShardPlan.from_spec(spec, num_train)
    world, batch = spec.distribution.world_size, spec.data.batch_size
    got = (
        f"Received: world_size {world}, data.batch_size {batch}, {num_train} training "
        f"sample(s), data.last_batch {spec.data.last_batch.value}"
    )
    if plan.steps_per_epoch == 0:
        raise UserError(
            f"no training step: the global batch ({batch}) is larger than the "
            f"{num_train} training sample(s) and data.last_batch: drop drops it; use "
            f"data.last_batch: keep or a smaller batch. {got}"
        )
    busy = min(batch, num_train)  # the most samples any step holds
    if world > busy:
        _warn_once(
            ("idle", f"{world}/{busy}"),
            f"{world - busy} of the {world} replicas get no sample at any step (a step holds "
            f"at most {busy} sample(s)); they only take part in the collectives. Use "
            f"--world-size {busy} or less. {got}",
        )
    elif batch > num_train:
        _warn_once(
            ("batch", f"{batch}/{num_train}"),
            f"the global batch ({batch}) is larger than the {num_train} training "
            f"sample(s): every epoch is one step of {num_train}. {got}",
        )


def warn_cancelled_biases(spec: Experiment) -> None:
    """A bias right before a batchnorm has an exactly-zero gradient; what is computed is rounding
    noise, which Adam-like optimizers divide by eps into real updates that differ between any two
    implementations. Training is unaffected, but the fp64 reference pair sees those tensors differ
    (docs/parity.md §9), so say so before the run, with the fix."""
    if spec.optimizer.name.value not in _NORMALISING:
        return
    for layer, norm in cancelled_biases(spec.model):
        key = (layer.prefix, spec.optimizer.name.value)
        if key in _WARNED:  # compare validates four runs of one spec: say it once
            continue
        _WARNED.add(key)
        print(
            f"dualtrain: warning: {where(layer.prefix)} ({layer.spec.type.value}) feeds the "
            f"batchnorm {where(norm.prefix)}, which cancels its bias (zero gradient); under "
            f"{spec.optimizer.name.value} rounding noise moves it, and the fp64 reference pair may "
            f"report that bias and the batchnorm's running_mean as differing. Set bias: false on "
            f"{where(layer.prefix)}.",
            file=sys.stderr,
            flush=True,
        )


def check_batchnorm_batches(spec: Experiment, num_train: int) -> None:
    """Refuse, before any process starts, a step where a batchnorm layer would normalise over fewer
    than 2 values per channel: on one replica (sync: false) or over the global batch (sync: true).
    Batch sizes repeat every epoch and only the last step of an epoch can be smaller, so the first
    and last steps of the first epoch decide."""
    norms = batchnorm_layers(spec.model)
    if not norms:
        return
    plan = ShardPlan.from_spec(spec, num_train)
    total = steps_total(spec, plan)
    last = plan.steps_per_epoch - 1
    for k in sorted({0, last}):
        if k >= total:
            continue
        sizes = plan.step_sizes(k)
        for r, per_sample in norms:
            what = f"{where(r.prefix)} (batchnorm, sync: {str(r.spec.sync).lower()})"
            at = f"at step {k + 1}{' (the last of every epoch)' if k == last and k else ''}"
            got = (
                f"Received: batch_size {spec.data.batch_size}, world_size {plan.world_size}, "
                f"{num_train} train samples, last_batch {spec.data.last_batch.value}"
            )
            if r.spec.sync:
                n = sum(sizes)
                if n * per_sample < 2:
                    raise UserError(
                        f"{what}: {at} the global batch holds {n} sample(s), "
                        f"{n * per_sample} value(s) per channel; batchnorm needs at least "
                        f"2. Use data.last_batch: drop. {got}"
                    )
                continue
            replica = min(range(len(sizes)), key=lambda i: sizes[i])
            n = sizes[replica]
            if n * per_sample < 2:
                raise UserError(
                    f"{what}: {at} replica {replica} holds {n} sample(s), "
                    f"{n * per_sample} value(s) per channel; batchnorm needs at least 2. "
                    f"Use sync: true (statistics over the global batch) or "
                    f"data.last_batch: drop. {got}"
                )


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
