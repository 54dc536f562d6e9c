"""What an audit record says of its run's set-up (audit.json's ``config``), read into typed
sections: the diagnoses read these, not the JSON's keys. The recorders write the JSON
(dualtrain.backends.*.audit_setup); :meth:`RunConfig.from_json` is the one place that reads it.

A framework object's own options (an optimizer's ``lr`` or ``learning_rate``, a scheduler's, a
sampler's, a callback's) keep that framework's names in a read-only :class:`Options`:
dualtrain.spec.optimizers pairs the torch and Keras names (KERAS_NAMES). ``json`` keeps what was
read: a fix's edits are written into a copy of it and read again (dualtrain.audit.remedy)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

#: how the torch recorder knew the epochs: counted loops over the loader, set_epoch calls, a
#: trainer's own count ("script"), or not at all ("unknown": the epoch checks are blind)
EpochsKnown = Literal["counted", "set_epoch", "script", "unknown"]


class Options(Mapping[str, Any]):
    """A framework object's class (``type``) and options, under that framework's own names,
    read-only. Empty where the record has none (``bool(options)`` is False)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = MappingProxyType(dict(values or {}))

    @property
    def type(self) -> str | None:
        kind = self._values.get("type")
        return None if kind is None else str(kind)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Options({dict(self._values)!r})"


@dataclass(frozen=True)
class BatchNormLayer:
    """A BatchNorm layer: its momentum under its framework's ``convention`` (torch keeps 1 - m of
    the running statistics a step, Keras m; None: torch's cumulative average), eps, and whether
    its batch statistics are over every replica's rows (None: the record does not say)."""

    name: str
    momentum: float | None
    eps: float
    convention: str
    synchronized: bool | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BatchNormLayer:
        return cls(d["name"], d["momentum"], d["eps"], d["convention"], d.get("synchronized"))


@dataclass(frozen=True)
class LossScale:
    """The loss-scaling rule (GradScaler, LossScaleOptimizer) as its settings start it."""

    type: str
    initial_scale: float
    growth_interval: int
    growth_factor: float
    backoff_factor: float

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LossScale:
        return cls(
            str(d.get("type")),
            float(d["initial_scale"]),
            int(d["growth_interval"]),
            float(d["growth_factor"]),
            float(d["backoff_factor"]),
        )

    SETTINGS = ("initial_scale", "growth_interval", "growth_factor", "backoff_factor")

    def setting(self, key: str) -> float:
        return float(getattr(self, key))


@dataclass(frozen=True)
class Precision:
    """The dtypes: the parameters' (torch) or the variables' and the policy's (Keras), the one
    the forward computes in, and torch's autocast dtype (None: no autocast seen)."""

    param_dtype: str | None = None
    compute_dtype: str | None = None
    variable_dtype: str | None = None
    policy: str | None = None
    autocast: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Precision:
        def text(key: str) -> str | None:
            return None if d.get(key) is None else str(d[key])

        return cls(
            text("param_dtype"),
            text("compute_dtype"),
            text("variable_dtype"),
            text("policy"),
            text("autocast"),
        )

    def dtype(self, key: str) -> str | None:
        """The parameters' dtype (a Keras record's variables') or the compute dtype."""
        value: str | None = getattr(self, key)
        return value or (self.variable_dtype if key == "param_dtype" else None)


@dataclass(frozen=True)
class NotHeld:
    """Trainable parameters the recorded optimizer never held, of ``of`` trainable ones."""

    names: tuple[str, ...]
    of: int | str = "?"


@dataclass(frozen=True)
class Loader:
    """The torch DataLoader the recorder was given."""

    batch_size: int | None = None
    drop_last: bool | None = None
    batches: int | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class FitData:
    """What Keras fit read: its input's kind, the workers, a tf.data dataset's auto-shard policy
    and whether fit shuffles the arrays itself."""

    kind: str | None = None
    workers: int = 1
    auto_shard_policy: str | None = None
    fit_shuffle: bool | Literal["batch"] = False


@dataclass(frozen=True)
class Sampler:
    """A torch sampler: its class and options (:class:`Options`, torch's attribute names), the
    dataset's size and the epoch each epoch's ``set_epoch`` gave (None: not called)."""

    options: Options = field(default_factory=Options)
    dataset_size: int | None = None
    epochs: tuple[int | None, ...] = ()

    @property
    def type(self) -> str | None:
        return self.options.type

    def __bool__(self) -> bool:
        return bool(self.options)


@dataclass(frozen=True)
class Clipping:
    """The clipping a torch loop did, as the recorder saw it run, over its ``steps``: each call's
    function, limits, steps and active steps (:class:`Options` each)."""

    calls: tuple[Options, ...] = ()
    steps: int | None = None


@dataclass(frozen=True)
class Replicas:
    """Each torch rank's parameters digested at the start and the end: how many arrays, and per
    rank the names apart from rank 0's (``init``, ``final``) and how many arrays those are."""

    arrays: int = 0
    init: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    final: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    init_arrays: Mapping[str, int] = field(default_factory=dict)
    final_arrays: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Replicas:
        def names(key: str) -> dict[str, tuple[str, ...]]:
            return {str(k): tuple(v) for k, v in (d.get(key) or {}).items()}

        def counts(key: str) -> dict[str, int]:
            return {str(k): int(v) for k, v in (d.get(key) or {}).items()}

        return cls(int(d.get("arrays", 0)), names("init"), names("final"),
                   counts("init_arrays"), counts("final_arrays"))  # fmt: skip

    def apart(self, when: str) -> tuple[Mapping[str, tuple[str, ...]], Mapping[str, int]]:
        """At ``when`` ("init" or "final"): each rank's names apart from rank 0's, and how many
        arrays those are where the record counted them."""
        if when == "init":
            return self.init, self.init_arrays
        return self.final, self.final_arrays


def _known(cls: Any, d: Mapping[str, Any] | None) -> Any:
    """``cls`` made of the keys of ``d`` it has fields for (a record may hold more)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (d or {}).items() if k in names and v is not None})


def _optional(d: Mapping[str, Any], key: str) -> Options | None:
    value = d.get(key)
    return Options(value) if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class RunConfig:
    """The sections of a record's set-up. Absent sections are empty or None; ``ddp`` and
    ``random_layers`` are None where the record does not say (a Keras record, an older one)."""

    json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    optimizer: Options = field(default_factory=Options)
    scheduler: Options = field(default_factory=Options)
    sampler: Sampler = field(default_factory=Sampler)
    loader: Loader | None = None
    data: FitData = field(default_factory=FitData)
    precision: Precision = field(default_factory=Precision)
    loss_scale: LossScale | None = None
    batchnorm: tuple[BatchNormLayer, ...] = ()
    mode_layers: tuple[str, ...] = ()
    random_layers: tuple[str, ...] | None = None
    eval_steps: tuple[int, ...] = ()
    frozen: Mapping[str, int] = field(default_factory=dict)
    not_held: NotHeld | None = None
    ddp: bool | None = None
    replicas: Replicas | None = None
    clipping: Clipping | None = None
    ema: Options | None = None
    early_stopping: Options | None = None
    lr_callbacks: tuple[Options, ...] = ()
    loss_terms: Options = field(default_factory=Options)
    variable_names: Mapping[str, str] = field(default_factory=dict)
    epochs: EpochsKnown | None = None
    trainer: str | None = None
    strategy: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunConfig:
        """The sections of audit.json's ``config`` (a dict the recorders wrote)."""
        sampler, replicas, clipping = d.get("sampler") or {}, d.get("replicas"), d.get("clipping")
        not_held = d.get("not_held")
        return cls(
            json=MappingProxyType(dict(d)),
            optimizer=Options(d.get("optimizer")),
            scheduler=Options(d.get("scheduler")),
            sampler=Sampler(
                Options({k: v for k, v in sampler.items() if k not in ("dataset_size", "epochs")}),
                sampler.get("dataset_size"),
                tuple(sampler.get("epochs") or ()),
            ),
            loader=_known(Loader, d["loader"]) if d.get("loader") else None,
            data=_known(FitData, d.get("data")),
            precision=Precision.from_json(d.get("precision") or {}),
            loss_scale=LossScale.from_json(d["loss_scale"]) if d.get("loss_scale") else None,
            batchnorm=tuple(map(BatchNormLayer.from_json, d.get("batchnorm") or ())),
            mode_layers=tuple(d.get("mode_layers") or ()),
            random_layers=None if d.get("random_layers") is None else tuple(d["random_layers"]),
            eval_steps=tuple(d.get("eval_steps") or ()),
            frozen=dict(d.get("frozen") or {}),
            not_held=NotHeld(tuple(not_held["names"]), not_held.get("of", "?"))
            if not_held
            else None,
            ddp=d.get("ddp"),
            replicas=Replicas.from_json(replicas) if isinstance(replicas, Mapping) else None,
            clipping=Clipping(
                tuple(map(Options, clipping.get("calls") or ())), clipping.get("steps")
            )
            if isinstance(clipping, Mapping)
            else None,
            ema=_optional(d, "ema"),
            early_stopping=_optional(d, "early_stopping"),
            lr_callbacks=tuple(map(Options, d.get("lr_callbacks") or ())),
            loss_terms=Options(d.get("loss_terms")),
            variable_names=dict(d.get("variable_names") or {}),
            epochs=d.get("epochs"),
            trainer=d.get("trainer"),
            strategy=d.get("strategy"),
        )

    def unread(self) -> set[str]:
        """The record's top-level keys no section reads (a recorder's new key without its
        section here: what the diagnoses would never see)."""
        return set(self.json) - {f.name for f in fields(self)}

    def without(self, section: str) -> RunConfig:
        """This set-up with a top-level section left out, as a record that has none."""
        return RunConfig.from_json({k: v for k, v in self.json.items() if k != section})

    def edited(self, changes: Mapping[str, Any]) -> RunConfig:
        """This set-up with top-level sections replaced by ``changes`` (JSON, as a recorder
        writes them) and read again."""
        return RunConfig.from_json({**self.json, **changes})
