"""The Experiment spec: YAML -> frozen dataclasses, shared by both backends.

Every section is a frozen, keyword-only dataclass. Loading rejects unknown keys by their full path
(``optimizer.lrr``), converts closed vocabularies to ``str`` enums, and range-checks values in
``__post_init__``. Errors are :class:`dualtrain.errors.UserError` with one line of text naming the field
and the received value, e.g. ``optimizer.lr must be > 0. Received: -1``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dualtrain.errors import UserError

_E = TypeVar("_E", bound="StrEnum")


class StrEnum(str, enum.Enum):
    """A closed vocabulary whose members are plain strings (JSON/YAML friendly)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]

    @classmethod
    def parse(cls: type[_E], value: Any, path: str) -> _E:
        """The member ``value`` names: its value in any letter case, or an unambiguous alias the
        frameworks use (``pytorch``, ``mixed_float16``, ``Dense``, ``linear``); recorded by its
        canonical value. Otherwise a UserError that suggests the closest names."""
        if isinstance(value, str):
            key = value.strip().lower()
            if key in cls.values():
                return cls(key)
            alias = ALIASES.get(cls.__name__, {}).get(key.replace("-", "_"))
            if alias is not None:
                return cls(alias)
            close = difflib.get_close_matches(key, cls.values() + list(ALIASES.get(cls.__name__, {})),
                                              n=2, cutoff=0.6)
            names = [ALIASES.get(cls.__name__, {}).get(c, c) for c in close]
            if names:
                hint = " or ".join(f"'{n}'" for n in dict.fromkeys(names))
                raise UserError(f"{path} must be one of {cls.values()}; did you mean {hint}? "
                                f"Received: {value!r}")
        raise UserError(f"{path} must be one of {cls.values()}. Received: {value!r}")


#: Names users bring from the frameworks, per vocabulary (keys lower case, "-" read as "_").
ALIASES: dict[str, dict[str, str]] = {
    "Backend": {"pytorch": "torch", "tensorflow": "tf", "keras": "tf"},
    "Precision": {"float32": "fp32", "single": "fp32", "float16": "fp16", "half": "fp16",
                  "mixed_float16": "fp16", "bfloat16": "bf16", "mixed_bfloat16": "bf16",
                  "float64": "fp64", "double": "fp64"},
    "LayerType": {"linear": "dense", "conv2d": "conv2d", "conv": "conv2d",
                  "maxpooling2d": "maxpool2d", "maxpool": "maxpool2d",
                  "averagepooling2d": "avgpool2d", "avgpool": "avgpool2d",
                  "globalaveragepooling2d": "global_avgpool", "adaptiveavgpool2d": "global_avgpool",
                  "batchnormalization": "batchnorm", "batchnorm2d": "batchnorm",
                  "batchnorm1d": "batchnorm", "syncbatchnorm": "batchnorm"},
    "ScheduleName": {"cosineannealing": "cosine", "cosineannealinglr": "cosine",
                     "cosinedecay": "cosine", "steplr": "step"},
}


class Backend(StrEnum):
    TORCH = "torch"
    TF = "tf"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    #: float64 parameters, activations, loss and optimizer state: the reference precision
    FP64 = "fp64"

    @property
    def param_dtype(self) -> str:
        """NumPy name of the parameters' (and optimizer state's) dtype: float64 for fp64, else
        float32 (fp16/bf16 keep float32 master weights)."""
        return "float64" if self is Precision.FP64 else "float32"


class LastBatch(StrEnum):
    DROP = "drop"
    KEEP = "keep"


class Sharding(StrEnum):
    #: every sample exactly once per epoch, contiguous balanced split of each global batch
    EXACT = "exact"
    #: torch.utils.data.DistributedSampler + DataLoader, padding and rank striding included
    TORCH_SAMPLER = "torch_sampler"


class OptimizerName(StrEnum):
    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"
    ADADELTA = "adadelta"
    RMSPROP = "rmsprop"


class ScheduleName(StrEnum):
    CONSTANT = "constant"
    STEP = "step"
    COSINE = "cosine"


class ScheduleInterval(StrEnum):
    #: the lr changes every optimizer step (the default)
    STEP = "step"
    #: the lr changes once per epoch, as a torch scheduler stepped after each epoch
    EPOCH = "epoch"


class Device(StrEnum):
    CPU = "cpu"
    GPU = "gpu"


class TFStrategy(StrEnum):
    MIRRORED = "mirrored"
    MULTI_WORKER = "multi_worker"


class LayerType(StrEnum):
    DENSE = "dense"
    CONV2D = "conv2d"
    MAXPOOL2D = "maxpool2d"
    AVGPOOL2D = "avgpool2d"
    GLOBAL_AVGPOOL = "global_avgpool"
    FLATTEN = "flatten"
    RELU = "relu"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    GELU = "gelu"
    DROPOUT = "dropout"
    BATCHNORM = "batchnorm"
    RESIDUAL = "residual"


class Every(StrEnum):
    EPOCH = "epoch"


class Progress(StrEnum):
    AUTO = "auto"
    BAR = "bar"
    LINES = "lines"


class Padding(StrEnum):
    VALID = "valid"
    SAME = "same"


def _fail(path: str, requirement: str, value: Any) -> UserError:
    return UserError(f"{path} {requirement}. Received: {value!r}")


def _check(cond: bool, path: str, requirement: str, value: Any) -> None:
    if not cond:
        raise _fail(path, requirement, value)


_SPEC = dict(frozen=True, kw_only=True, slots=True)

#: Field policies, declared on the schema (``_tagged``) and read by :func:`paths_with`:
COSMETIC = "cosmetic"
"""Cannot change the numbers of a run (names, paths, rendezvous, logging): compare lists a
difference but never fails on it or names it as a cause."""
FREE = "free"
"""May differ between a checkpoint and the run that continues it (how the run is distributed and
logged, where the data lies, how often it checkpoints); every other field must match."""


def _tagged(*tags: str, **kwargs: Any) -> Any:
    """A field (``default=`` or ``default_factory=``) carrying the policies ``tags``; on a section,
    they hold for every field in it."""
    return field(metadata={"policy": frozenset(tags)}, **kwargs)


@dataclass(**_SPEC)
class DataSpec:
    dataset: str = "mnist"
    """Dataset name. Only ``mnist`` for now."""
    data_dir: str | None = _tagged(COSMETIC, FREE, default=None)
    """Folder with the canonical MNIST files (IDX, gzipped or not, or mnist.npz). None: offline copy or cache."""
    download: bool = _tagged(COSMETIC, FREE, default=True)
    """Allow a checksum-verified download into the cache when no local copy is found."""
    batch_size: int = 128
    """Global batch size (all replicas together)."""
    eval_batch_size: int = 1000
    """Global batch size for evaluation."""
    shuffle: bool = True
    """Shuffle the training order every epoch (permutation from seed and epoch)."""
    last_batch: LastBatch = LastBatch.KEEP
    """What to do with a partial last global batch: keep it (split across replicas) or drop it."""
    sharding: Sharding = Sharding.EXACT
    """How a global batch is split: ``exact`` (no duplicates) or ``torch_sampler`` (DistributedSampler)."""
    train_limit: int | None = None
    """Use only the first N training samples (quick runs and tests)."""
    test_limit: int | None = None
    """Use only the first N test samples."""

    def __post_init__(self) -> None:
        _check(self.dataset == "mnist", "data.dataset", "must be 'mnist'", self.dataset)
        _check(self.batch_size >= 1, "data.batch_size", "must be >= 1", self.batch_size)
        _check(self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1", self.eval_batch_size)
        for name in ("train_limit", "test_limit"):
            v = getattr(self, name)
            _check(v is None or v >= 1, f"data.{name}", "must be >= 1 or null", v)


@dataclass(**_SPEC)
class LayerSpec:
    type: LayerType
    """One of dense, conv2d, maxpool2d, avgpool2d, global_avgpool, flatten, relu, tanh, sigmoid, gelu
    (exact erf form), dropout, batchnorm, residual."""
    units: int | None = None
    """dense: output features."""
    filters: int | None = None
    """conv2d: output channels."""
    kernel_size: int | None = None
    """conv2d: square kernel size."""
    pool_size: int | None = None
    """maxpool2d, avgpool2d: square window (stride defaults to the window)."""
    stride: int | None = None
    """conv2d (default 1), maxpool2d and avgpool2d (default pool_size)."""
    rate: float | None = None
    """dropout: the drop probability p in [0, 1) (inverted scaling by 1/(1-p), off in evaluation; the
    mask is a hash of seed, step, sample id, layer and element: dualtrain/core/dropout.py)."""
    padding: Padding | int = Padding.VALID
    """conv2d: valid, same ('same' only with stride 1, where torch and Keras agree), or an integer P:
    P zeros on every side (torch's ``padding=P``), with any stride."""
    bias: bool = True
    """dense, conv2d: add a bias (torch's ``bias=False`` / Keras's ``use_bias=False`` when false, as
    before a batchnorm, whose mean subtraction cancels it)."""
    momentum: float | None = None
    """batchnorm: torch's momentum (default 0.1): running = (1 - momentum) * running + momentum *
    batch statistic (the unbiased variance for running_var)."""
    eps: float | None = None
    """batchnorm: added to the biased batch variance before the square root (default 1e-5)."""
    sync: bool | None = None
    """batchnorm: true: statistics over the whole global batch, every replica weighted by its sample
    count (torch SyncBatchNorm); false (default): each replica's own batch, and the running statistics
    are replica 0's (DDP's buffer broadcast), on both backends. docs/parity.md §9."""
    body: tuple[LayerSpec, ...] = ()
    """residual: the layers of the residual branch; the block outputs body(x) + shortcut(x)."""
    shortcut: tuple[LayerSpec, ...] = ()
    """residual: layers on the skip path (e.g. a 1x1 conv2d with stride 2 and a batchnorm); empty:
    the identity."""

    def __post_init__(self) -> None:
        t = self.type
        allowed = {
            LayerType.DENSE: {"units"},
            LayerType.CONV2D: {"filters", "kernel_size", "stride", "padding"},
            LayerType.MAXPOOL2D: {"pool_size", "stride"},
            LayerType.AVGPOOL2D: {"pool_size", "stride"},
            LayerType.DROPOUT: {"rate"},
            LayerType.BATCHNORM: {"momentum", "eps", "sync"},
            LayerType.RESIDUAL: {"body", "shortcut"},
        }.get(t, set())
        for name in ("momentum", "eps", "sync", "body", "shortcut"):
            v = getattr(self, name)
            if v not in (None, ()) and name not in allowed:
                raise UserError(f"layer type {t.value!r} takes no '{name}'. Received: {name}={v!r}")
        if not self.bias and t not in (LayerType.DENSE, LayerType.CONV2D):
            raise UserError(f"layer type {t.value!r} takes no 'bias'. Received: bias=False")
        if t is LayerType.BATCHNORM:
            for name, default in (("momentum", 0.1), ("eps", 1e-5), ("sync", False)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
            assert self.momentum is not None and self.eps is not None  # defaults set just above
            _check(0.0 <= self.momentum <= 1.0, "layer batchnorm.momentum", "must be in [0, 1]",
                   self.momentum)
            _check(self.eps > 0.0, "layer batchnorm.eps", "must be > 0", self.eps)
        if t is LayerType.RESIDUAL:
            _check(bool(self.body), "layer residual.body", "must list at least one layer", list(self.body))
            for part in ("body", "shortcut"):
                for j, inner in enumerate(getattr(self, part)):
                    if inner.type in (LayerType.RESIDUAL, LayerType.FLATTEN):
                        raise UserError(f"layer residual.{part}[{j}]: a residual block cannot hold a "
                                        f"{inner.type.value} layer (blocks do not nest; flatten changes "
                                        f"the shape the add needs). Received: {inner.type.value}")
        if self.rate is not None:
            if "rate" not in allowed:
                raise UserError(f"layer type {t.value!r} takes no 'rate'. Received: rate={self.rate!r}")
            _check(0.0 <= self.rate < 1.0, "layer dropout.rate", "must be in [0, 1)", self.rate)
        for name in ("units", "filters", "kernel_size", "pool_size", "stride"):
            v = getattr(self, name)
            if v is not None and name not in allowed:
                raise UserError(f"layer type {t.value!r} takes no '{name}'. Received: {name}={v!r}")
            if v is not None:
                _check(v >= 1, f"layer {t.value}.{name}", "must be >= 1", v)
        if self.padding is not Padding.VALID and "padding" not in allowed:
            raise UserError(f"layer type {t.value!r} takes no 'padding'. Received: {self.padding!r}")
        if isinstance(self.padding, int):
            _check(self.padding >= 0, f"layer {t.value}.padding", "must be >= 0, valid or same",
                   self.padding)
        required = {LayerType.DENSE: ("units",), LayerType.CONV2D: ("filters", "kernel_size"),
                    LayerType.MAXPOOL2D: ("pool_size",), LayerType.AVGPOOL2D: ("pool_size",),
                    LayerType.DROPOUT: ("rate",)}.get(t, ())
        for name in required:
            if getattr(self, name) is None:
                raise UserError(f"layer type {t.value!r} needs '{name}'. Received: {name}=None")
        if t is LayerType.CONV2D and self.padding is Padding.SAME and (self.stride or 1) != 1:
            raise UserError(
                f"conv2d padding 'same' needs stride 1 (torch and Keras pad strided convs differently; "
                f"an integer padding such as 1 pads every side equally on both). "
                f"Received: stride={self.stride}"
            )


@dataclass(**_SPEC)
class ModelSpec:
    preset: str | None = None
    """``mlp`` (784-256-128-10, the default) or ``cnn`` (two conv blocks + dense). Mutually exclusive
    with layers; set ``preset: null`` to use layers."""
    layers: tuple[LayerSpec, ...] = ()
    """Explicit layer list, e.g. ``[{type: flatten}, {type: dense, units: 10}]``."""
    init_from: str | None = _tagged(COSMETIC, default=None)
    """Canonical-layout .npz with the initial weights; None: generate them from the seed."""

    def __post_init__(self) -> None:
        if self.preset is not None:
            _check(self.preset in PRESETS, "model.preset", f"must be one of {sorted(PRESETS)}", self.preset)
            if self.layers:
                raise UserError("model: give either 'preset' or 'layers', not both. Received: both")
        elif not self.layers:
            raise UserError("model: give a 'preset' (mlp, cnn) or a 'layers' list. Received: neither")

    def resolved_layers(self) -> tuple[LayerSpec, ...]:
        return PRESETS[self.preset] if self.preset is not None else self.layers


def _layers(*items: dict[str, Any]) -> tuple[LayerSpec, ...]:
    def layer(d: dict[str, Any]) -> LayerSpec:
        kwargs: dict[str, Any] = {k: (LayerType(v) if k == "type" else v) for k, v in d.items()}
        return LayerSpec(**kwargs)
    return tuple(layer(d) for d in items)


PRESETS: dict[str, tuple[LayerSpec, ...]] = {
    "mlp": _layers(
        {"type": "flatten"},
        {"type": "dense", "units": 256}, {"type": "relu"},
        {"type": "dense", "units": 128}, {"type": "relu"},
        {"type": "dense", "units": 10},
    ),
    "cnn": _layers(
        {"type": "conv2d", "filters": 32, "kernel_size": 3}, {"type": "relu"},
        {"type": "maxpool2d", "pool_size": 2},
        {"type": "conv2d", "filters": 64, "kernel_size": 3}, {"type": "relu"},
        {"type": "maxpool2d", "pool_size": 2},
        {"type": "flatten"},
        {"type": "dense", "units": 128}, {"type": "relu"},
        {"type": "dense", "units": 10},
    ),
}


@dataclass(**_SPEC)
class ScheduleSpec:
    name: ScheduleName = ScheduleName.CONSTANT
    """constant, step (lr * gamma ** (step // step_size)) or cosine (to min_lr over the run)."""
    step_size: int = 1000
    """step: optimizer steps between decays."""
    gamma: float = 0.1
    """step: decay factor."""
    min_lr: float = 0.0
    """cosine: final learning rate."""
    warmup_steps: int = 0
    """Linear warmup from lr/warmup_steps to lr over this many steps."""
    interval: ScheduleInterval = ScheduleInterval.STEP
    """step: the lr changes every optimizer step; epoch: once per epoch (step_size and warmup_steps
    then count epochs), as torch's StepLR/CosineAnnealingLR stepped after each epoch."""

    def __post_init__(self) -> None:
        _check(self.step_size >= 1, "optimizer.schedule.step_size", "must be >= 1", self.step_size)
        _check(0 < self.gamma <= 1, "optimizer.schedule.gamma", "must be in (0, 1]", self.gamma)
        _check(self.min_lr >= 0, "optimizer.schedule.min_lr", "must be >= 0", self.min_lr)
        _check(self.warmup_steps >= 0, "optimizer.schedule.warmup_steps", "must be >= 0", self.warmup_steps)


@dataclass(**_SPEC)
class OptimizerSpec:
    name: OptimizerName = OptimizerName.SGD
    """sgd, adam, adamw, adadelta or rmsprop (torch.optim semantics in both backends; see
    docs/parity.md)."""
    lr: float = 0.05
    """Peak learning rate."""
    momentum: float = 0.0
    """sgd and rmsprop: momentum (torch form: buf = m*buf + g; p -= lr*buf); other optimizers
    ignore it."""
    nesterov: bool = False
    """sgd: Nesterov momentum (needs momentum > 0)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """adam/adamw: (beta1, beta2)."""
    eps: float | None = None
    """adam/adamw: added to sqrt(v_hat); rmsprop: to sqrt(square_avg); adadelta: inside both square
    roots (torch placements). null: torch's default (1e-8; adadelta 1e-6)."""
    rho: float = 0.9
    """adadelta: decay of the squared-gradient and squared-update averages."""
    alpha: float = 0.99
    """rmsprop: decay of the squared-gradient average."""
    centered: bool = False
    """rmsprop: divide by the centered second moment (square_avg - grad_avg**2)."""
    weight_decay: float = 0.0
    """sgd/adam/adadelta/rmsprop: L2 added to the gradient; adamw: decoupled (p *= 1 - lr*wd)."""
    clip_grad_norm: float | None = None
    """Global-norm clipping of the all-reduced gradient (torch clip_grad_norm_ formula); null: off."""
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optimizer.lr", "must be > 0", self.lr)
        _check(0 <= self.momentum < 1, "optimizer.momentum", "must be in [0, 1)", self.momentum)
        if self.nesterov:
            _check(self.momentum > 0, "optimizer.nesterov", "needs momentum > 0", self.momentum)
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optimizer.betas",
               "must be two numbers in [0, 1)", list(self.betas))
        if self.eps is None:  # torch's default for this optimizer, written into the resolved spec
            object.__setattr__(self, "eps", 1e-6 if self.name is OptimizerName.ADADELTA else 1e-8)
        assert self.eps is not None  # set just above when it was null
        _check(self.eps > 0, "optimizer.eps", "must be > 0", self.eps)
        _check(0 <= self.rho <= 1, "optimizer.rho", "must be in [0, 1]", self.rho)
        _check(0 <= self.alpha <= 1, "optimizer.alpha", "must be in [0, 1]", self.alpha)
        if self.centered and self.name is not OptimizerName.RMSPROP:
            raise UserError(f"optimizer.centered is for rmsprop. Received: centered=true with "
                            f"{self.name.value}")

        _check(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay)
        if self.clip_grad_norm is not None:
            _check(self.clip_grad_norm > 0, "optimizer.clip_grad_norm", "must be > 0 or null",
                   self.clip_grad_norm)


@dataclass(**_SPEC)
class LossScaleSpec:
    init: float = 65536.0
    """Initial loss scale (torch GradScaler default 2**16; Keras uses 2**15)."""
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    """Grow the scale after this many consecutive finite steps."""

    def __post_init__(self) -> None:
        _check(self.init > 0, "precision.loss_scale.init", "must be > 0", self.init)
        _check(self.growth_factor >= 1, "precision.loss_scale.growth_factor", "must be >= 1",
               self.growth_factor)
        _check(0 < self.backoff_factor < 1, "precision.loss_scale.backoff_factor", "must be in (0, 1)",
               self.backoff_factor)
        _check(self.growth_interval >= 1, "precision.loss_scale.growth_interval", "must be >= 1",
               self.growth_interval)


@dataclass(**_SPEC)
class PrecisionSpec:
    dtype: Precision = Precision.FP32
    """fp32, fp16 (autocast/mixed_float16 + dynamic loss scaling), bf16 (no loss scaling) or fp64
    (float64 everywhere: the reference precision ``dualtrain compare`` checks semantics with)."""
    loss_scale: LossScaleSpec = field(default_factory=LossScaleSpec)


@dataclass(**_SPEC)
class DistributionSpec:
    world_size: int = 1
    """Number of replicas (torch: processes; tf: devices or worker processes)."""
    device: Device = Device.CPU
    """cpu (gloo) or gpu (nccl)."""
    master_addr: str = _tagged(COSMETIC, default="127.0.0.1")
    """Rendezvous address for locally launched workers."""
    master_port: int | None = _tagged(COSMETIC, default=None)
    """Rendezvous port; null picks a free one."""
    timeout_s: float = _tagged(COSMETIC, default=120.0)
    """Bound on startup and on any single collective: a lost peer fails the run instead of hanging."""
    threads_per_worker: int | None = _tagged(COSMETIC, default=None)
    """Intra-op threads per worker process; null: cores // local workers."""
    max_restarts: int = _tagged(COSMETIC, default=0)
    """When a worker dies (killed, OOM, a lost node), stop the others and restart every worker from
    the latest checkpoint, at most this many times (torchrun's --max-restarts); then fail naming the
    rank. Without checkpoints a restart begins again at step 1."""

    def __post_init__(self) -> None:
        _check(self.world_size >= 1, "distribution.world_size", "must be >= 1", self.world_size)
        _check(self.max_restarts >= 0, "distribution.max_restarts", "must be >= 0", self.max_restarts)
        _check(self.timeout_s > 0, "distribution.timeout_s", "must be > 0", self.timeout_s)
        if self.master_port is not None:
            _check(0 < self.master_port < 65536, "distribution.master_port", "must be in 1..65535",
                   self.master_port)
        if self.threads_per_worker is not None:
            _check(self.threads_per_worker >= 1, "distribution.threads_per_worker", "must be >= 1",
                   self.threads_per_worker)


@dataclass(**_SPEC)
class TFSpec:
    strategy: TFStrategy = _tagged(COSMETIC, default=TFStrategy.MIRRORED)
    """mirrored (one process, N local devices) or multi_worker (N processes, TF_CONFIG)."""


@dataclass(**_SPEC)
class TrainSpec:
    epochs: int | None = 1
    """Number of epochs (null with max_steps: as many as max_steps needs)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (counted across epochs)."""
    eval_every: int = 0
    """Evaluate every N steps; 0: at the end of every epoch. A final evaluation always runs."""
    log_every: int = _tagged(COSMETIC, FREE, default=50)
    """Progress line and metrics flush every N steps."""
    checkpoint_every: Every | int | None = _tagged(COSMETIC, FREE, default=None)
    """Write a checkpoint every N steps, or ``epoch``: at the end of every epoch; null: never. A run
    that checkpoints also writes one after its last step (RUN_DIR/checkpoints, docs/checkpoints.md)."""
    keep_checkpoints: int = _tagged(COSMETIC, FREE, default=3)
    """Keep the newest K complete checkpoints; older ones are deleted once a newer one is complete."""

    def __post_init__(self) -> None:
        if isinstance(self.checkpoint_every, int):
            _check(self.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1, epoch or null",
                   self.checkpoint_every)
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1",
               self.keep_checkpoints)
        if self.epochs is None and self.max_steps is None:
            raise UserError("train: give epochs or max_steps. Received: neither")
        if self.epochs is not None:
            _check(self.epochs >= 1, "train.epochs", "must be >= 1", self.epochs)
        if self.max_steps is not None:
            _check(self.max_steps >= 1, "train.max_steps", "must be >= 1", self.max_steps)
        _check(self.eval_every >= 0, "train.eval_every", "must be >= 0", self.eval_every)
        _check(self.log_every >= 1, "train.log_every", "must be >= 1", self.log_every)


@dataclass(**_SPEC)
class LoggingSpec:
    """Where a run reports besides metrics.jsonl (which is always written). Changing it never changes
    the training: a run may resume or continue with other logging settings."""

    tensorboard: bool = True
    """TensorBoard event files from the chief in RUN_DIR/tensorboard (tags train/loss, train/lr,
    train/grad_norm, train/loss_scale, train/samples_per_s, eval/loss, eval/accuracy; the same on
    both backends)."""
    progress: Progress = Progress.AUTO
    """auto: a live progress bar when the chief writes to an interactive terminal, plain lines
    otherwise (log files, CI); bar: always the bar; lines: always plain lines."""


@dataclass(**_SPEC)
class DebugSpec:
    """Inspection and fault injection, for tests and debugging. Leave empty in real runs."""

    dump_grads: tuple[int, ...] = _tagged(COSMETIC, default=())
    """Steps (1-based) whose all-reduced, unscaled, unclipped gradient the chief saves as
    ``grads_step{N}.npz`` (canonical layout)."""
    nonfinite_grad: tuple[tuple[int, int], ...] = ()
    """(step, replica) pairs: that replica's local gradient is set to inf at that step."""
    exit_rank: tuple[int, int] | None = None
    """(step, rank): that worker process kills itself (SIGKILL) at that step, in the run's first
    attempt only (a restarted or resumed run does not fail again) unless exit_every_attempt."""
    exit_every_attempt: bool = False
    """exit_rank fires in every attempt (tests of max_restarts running out)."""
    crash_in_checkpoint: int | None = None
    """Step whose checkpoint write the chief dies in (SIGKILL after the weights file, before the
    manifest), in the first attempt only."""


@dataclass(**_SPEC)
class Experiment:
    name: str = _tagged(COSMETIC, FREE, default="experiment")
    """Run name, used in the default output directory."""
    seed: int = 0
    """Seeds the data order and the initial weights."""
    data: DataSpec = field(default_factory=DataSpec)
    model: ModelSpec = field(default_factory=lambda: ModelSpec(preset="mlp"))
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    distribution: DistributionSpec = _tagged(FREE, default_factory=DistributionSpec)
    tf: TFSpec = _tagged(FREE, default_factory=TFSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    determinism: bool = True
    """Deterministic kernels in both frameworks, TF32 off (see docs/parity.md)."""
    output_dir: str = _tagged(COSMETIC, FREE, default="runs")
    """Parent folder of run directories (``--out`` names the run directory itself)."""
    logging: LoggingSpec = _tagged(COSMETIC, FREE, default_factory=LoggingSpec)
    debug: DebugSpec = _tagged(FREE, default_factory=DebugSpec)

    def __post_init__(self) -> None:
        _check(bool(self.name) and "/" not in self.name, "name", "must be a non-empty name without '/'",
               self.name)
        _check(0 <= self.seed < 2**32, "seed", "must be in [0, 2**32)", self.seed)
        if self.data.sharding is Sharding.TORCH_SAMPLER:
            _check(self.data.batch_size % self.distribution.world_size == 0, "data.batch_size",
                   f"must be a multiple of world_size={self.distribution.world_size} with "
                   "sharding=torch_sampler", self.data.batch_size)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def replace(self, **changes: Any) -> Experiment:
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------------------------------
# Loading


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, LayerSpec):  # a layer names only what it sets: {type: dense, units: 10}
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.name == "type" or getattr(obj, f.name) != f.default}
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    return obj


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 2 and int in non_none:  # a vocabulary or an integer (conv2d padding)
            other = next(a for a in non_none if a is not int)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            try:
                return _convert(other, value, path)
            except UserError:
                is_vocab = isinstance(other, type) and issubclass(other, StrEnum)
                names = other.values() if is_vocab else []
                raise UserError(f"{path} must be one of {names} or an integer. "
                                f"Received: {value!r}") from None
        return _convert(non_none[0], value, path)
    if value is None:
        raise UserError(f"{path} must not be null. Received: None")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{path} must be a mapping. Received: {value!r}")
        return _build(typing.cast(type, tp), value, path)  # tp: a type hint, so a class
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return tp.parse(value, path)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{path} must be a list. Received: {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise UserError(f"{path} must have {len(args)} items. Received: {list(value)!r}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{path} must be true or false. Received: {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{path} must be an integer. Received: {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{path} must be a number. Received: {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{path} must be a string. Received: {value!r}")
    raise TypeError(f"unsupported spec type {tp!r} at {path}")  # programming error


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, data: dict[str, Any], path: str = "") -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    errors: list[str] = []  # every mistake of the file at once, not one per attempt
    count = 0
    for key in data:
        if key not in names:
            where = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            errors.append(f"unknown key '{where}' (valid keys{' in ' + path if path else ''}: "
                          f"{', '.join(names)}){hint} Received: {key}={data[key]!r}")
    hints = _hints(cls)
    kwargs = {}
    for name in names:
        if name in data:
            sub = f"{path}.{name}" if path else name
            try:
                kwargs[name] = _convert(hints[name], data[name], sub)
            except UserError as exc:
                errors.append(str(exc))
                count += getattr(exc, "count", 1) - 1
    if errors:
        count += len(errors)
        if path or count == 1:
            err = UserError("; ".join(errors))
            setattr(err, "count", count)  # read back with getattr(exc, "count", 1) above
            raise err
        raise UserError(f"{count} mistakes in the spec: " + "; ".join(errors))
    if cls is LayerSpec and "type" not in kwargs:
        raise UserError(f"{path} needs a 'type' ({', '.join(LayerType.values())}). Received: {data!r}")
    try:
        return cls(**kwargs)
    except UserError as exc:
        if cls is LayerSpec:  # the layer cannot know its own position in the list
            raise UserError(f"{path}: {exc}") from None
        raise
    except TypeError as exc:  # a missing required field
        raise UserError(f"{path or 'spec'}: {exc}. Received: {data!r}") from None


def _normalise(raw: dict[str, Any]) -> dict[str, Any]:
    """Accept the short forms users write: ``precision: fp16``."""
    raw = dict(raw)
    if isinstance(raw.get("precision"), str):
        raw["precision"] = {"dtype": raw["precision"]}
    model = raw.get("model")
    if isinstance(model, dict) and "preset" not in model and not model.get("layers"):
        raw["model"] = {**model, "preset": "mlp"}  # the default model, as when 'model' is absent
    return raw


def from_dict(raw: Any) -> Experiment:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"the spec must be a YAML mapping at the top level. Received: {type(raw).__name__}")
    return _build(Experiment, _normalise(raw))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``optimizer.lr=0.1`` -> (["optimizer", "lr"], 0.1); the value is parsed as YAML."""
    if "=" not in text:
        raise UserError(f"--set takes key.path=value. Received: {text!r}")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set key must be a dotted path like optimizer.lr. Received: {key!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = _normalise(raw or {})
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
            elif not isinstance(nxt, dict):
                raise UserError(f"--set {'.'.join(parts[:i + 1])} is not a section. Received: {text!r}")
            else:
                nxt = dict(nxt)
            node[part] = nxt
            node = nxt
        node[parts[-1]] = value
    return raw


#: The configs shipped with the package (the repository's configs/, linked into the package).
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"


def shipped_config(path: str | Path) -> Path | None:
    """A shipped config a user names as in the README from anywhere: ``mnist_mlp``,
    ``mnist_mlp.yaml`` or ``configs/mnist_mlp.yaml``; None if ``path`` names none."""
    p = Path(path)
    if p.is_absolute() or p.parent not in (Path("."), Path("configs")):
        return None
    name = p.name if p.suffix in (".yaml", ".yml") else p.name + ".yaml"
    found = SHIPPED_CONFIGS / name
    return found if found.is_file() else None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    named = shipped_config(p) if not p.exists() else None
    if named is not None:
        p = named
    if p.is_dir():
        found = sorted(q.name for q in p.glob("*.y*ml"))
        hint = f"; it holds {', '.join(found)}" if found else ""
        raise UserError(f"--config must be a YAML file, not a folder{hint}. Received: {str(p)!r}")
    if not p.is_file():
        shipped = ", ".join(sorted(q.stem for q in SHIPPED_CONFIGS.glob("*.yaml")))
        raise UserError(f"config file not found: {str(p)!r} (shipped configs, usable by name from "
                        f"anywhere: {shipped})")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{p}: invalid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: not a text file") from None
    if raw is None:  # an empty file: a user who meant all defaults passes no --config
        raise UserError(f"{p}: the file is empty (no spec in it); to train on the defaults, leave "
                        f"out --config. Received: {str(p)!r}")
    if not isinstance(raw, dict):
        raise UserError(f"{p}: the spec must be a YAML mapping at the top level. "
                        f"Received: {type(raw).__name__}")
    return raw


def load_spec(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read a YAML spec, apply ``key.path=value`` overrides, validate, return the frozen Experiment."""
    raw = read_yaml(path) if path is not None else {}
    return from_dict(apply_overrides(raw, list(overrides)))


def dump_spec(spec: Experiment) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)


def paths_with(policy: str, cls: type = Experiment, prefix: str = "") -> tuple[str, ...]:
    """The dotted spec paths declared with ``policy`` (:data:`COSMETIC`, :data:`FREE`); a tagged
    section is one path (everything under it)."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if policy in f.metadata.get("policy", ()):
            out.append(path)
        elif dataclasses.is_dataclass(hints[f.name]):
            out.extend(paths_with(policy, hints[f.name], path + "."))
    return tuple(out)


def has_path(path: str) -> bool:
    """Whether ``path`` (dotted, e.g. ``optimizer.schedule.name``) names a field or section of the
    Experiment schema."""
    cls: Any = Experiment
    for part in path.split("."):
        if not (dataclasses.is_dataclass(cls) and part in {f.name for f in dataclasses.fields(cls)}):
            return False
        cls = typing.get_type_hints(cls)[part]
    return True
