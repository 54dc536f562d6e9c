"""The Experiment and its sections (except the model's): frozen, keyword-only dataclasses whose
``__post_init__`` range-checks every value with a one-line UserError naming the field."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from dualtrain.errors import UserError
from dualtrain.spec.fields import (
    COSMETIC,
    FREE,
    SHOWS_IN_IDS,
    SHOWS_IN_INIT,
    SHOWS_IN_LR,
    SHOWS_IN_SCALE,
    SPEC_DATACLASS,
    check_field,
    tagged_field,
)
from dualtrain.spec.model import LayerSpec, ModelSpec
from dualtrain.spec.optimizers import OPTIMIZERS
from dualtrain.spec.vocab import (
    METRICS,
    Dataset,
    Device,
    Every,
    LastBatch,
    Normalize,
    OptimizerName,
    Precision,
    Progress,
    ScheduleInterval,
    ScheduleName,
    Sharding,
    StopMode,
    Strategy,
    TFStrategy,
)


@dataclass(**SPEC_DATACLASS)
class InputStats:
    """Given normalisation values for one input: one mean and std per channel (images) or feature
    (tables), or one value for all."""

    input: str = "x"
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_field(
            len(self.mean) >= 1 and len(self.mean) == len(self.std),
            f"data.stats[{self.input}]",
            "needs mean and std of the same length (>= 1)",
            {"mean": list(self.mean), "std": list(self.std)},
        )
        check_field(
            all(s > 0 and s < float("inf") for s in self.std),
            f"data.stats[{self.input}].std",
            "must be finite and > 0",
            list(self.std),
        )


@dataclass(**SPEC_DATACLASS)
class DataSpec:
    dataset: Dataset = Dataset.MNIST
    """mnist, arrays (your own .npz or .npy folder at ``path``), or a dataset bundled with
    scikit-learn: digits, wine, breast_cancer, diabetes (docs/data.md)."""
    path: str | None = tagged_field(COSMETIC, FREE, default=None)
    """arrays: an .npz file or a folder of .npy files holding ``{input}_train``, ``{input}_test``,
    ``{target}_train`` and ``{target}_test`` (.npy files are memory-mapped). Its content's sha256
    is what the run records and resume and continuation check, not the path."""
    target: str = "y"
    """arrays: the target's name (its arrays are ``{target}_train`` and ``{target}_test``)."""
    normalize: Normalize = Normalize.AUTO
    """auto: every input as (x - mean) / std per channel (images) or feature (tables), the values
    from ``stats`` where given, else computed once from the training split (validation excluded)
    and recorded in the run (MNIST: its usual (x / 255 - 0.1307) / 0.3081); none: inputs as stored,
    as float32."""
    stats: tuple[InputStats, ...] = ()
    """Given mean/std per input, e.g. ``[{input: x, mean: [0.5], std: [0.25]}]``."""
    validation: float | None = None
    """A validation split taken from the training split by ids: a fraction in (0, 1) (that many
    samples, drawn by a permutation of the seed, identical on both backends), or give
    ``validation_ids``. Evaluated beside the test split; never trained on."""
    validation_ids: tuple[int, ...] = ()
    """Explicit validation sample ids (rows of the training split); ``validation: [ids...]`` in a
    spec means the same."""
    data_dir: str | None = tagged_field(COSMETIC, FREE, default=None)
    """mnist: a folder with the canonical MNIST files (IDX, gzipped or not, or mnist.npz). None:
    offline copy or cache."""
    download: bool = tagged_field(COSMETIC, FREE, default=True)
    """mnist: allow a checksum-verified download into the cache when no local copy is found."""
    batch_size: int = 128
    """Global batch size (all replicas together) of one forward and backward: with
    train.accumulate K, an optimizer step takes K such micro-batches (K * batch_size samples)."""
    eval_batch_size: int = 1000
    """Global batch size for evaluation."""
    shuffle: bool = True
    """Shuffle the training order every epoch (permutation from seed and epoch)."""
    last_batch: LastBatch = LastBatch.KEEP
    """What to do with a partial last global batch: keep it (split across replicas) or drop it."""
    sharding: Sharding = Sharding.EXACT
    """How a global batch is split: ``exact`` (no duplicates) or ``torch_sampler``
    (DistributedSampler)."""
    train_limit: int | None = None
    """Use only the first N training samples (quick runs and tests); a validation split is taken
    from these N."""
    test_limit: int | None = None
    """Use only the first N test samples."""

    def __post_init__(self) -> None:
        check_field(self.batch_size >= 1, "data.batch_size", "must be >= 1", self.batch_size)
        check_field(
            self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1", self.eval_batch_size
        )
        for name in ("train_limit", "test_limit"):
            v = getattr(self, name)
            check_field(v is None or v >= 1, f"data.{name}", "must be >= 1 or null", v)
        if self.dataset is Dataset.ARRAYS:
            check_field(
                bool(self.path),
                "data.path",
                "must name an .npz file or a folder of .npy files with dataset: arrays",
                self.path,
            )
        else:
            check_field(
                self.path is None,
                "data.path",
                "is only for dataset: arrays",
                self.path,
            )
        check_field(self.target.isidentifier(), "data.target", "must be an identifier", self.target)
        if self.validation is not None:
            check_field(
                0.0 < self.validation < 1.0,
                "data.validation",
                "must be a fraction in (0, 1) or a list of sample ids",
                self.validation,
            )
            check_field(
                not self.validation_ids,
                "data.validation_ids",
                "cannot be given with a validation fraction",
                list(self.validation_ids),
            )
        ids = self.validation_ids
        check_field(
            all(i >= 0 for i in ids) and len(set(ids)) == len(ids),
            "data.validation_ids",
            "must be distinct ids >= 0",
            list(ids)[:10],
        )
        names = [s.input for s in self.stats]
        check_field(len(set(names)) == len(names), "data.stats", "names an input twice", names)
        check_field(
            not self.stats or self.normalize is Normalize.AUTO,
            "data.stats",
            "gives normalisation values, which data.normalize: none turns off; drop one",
            names,
        )


@dataclass(**SPEC_DATACLASS)
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
        check_field(
            self.step_size >= 1, "optimizer.schedule.step_size", "must be >= 1", self.step_size
        )
        check_field(
            0 < self.gamma <= 1, "optimizer.schedule.gamma", "must be in (0, 1]", self.gamma
        )
        check_field(self.min_lr >= 0, "optimizer.schedule.min_lr", "must be >= 0", self.min_lr)
        check_field(
            self.warmup_steps >= 0,
            "optimizer.schedule.warmup_steps",
            "must be >= 0",
            self.warmup_steps,
        )


@dataclass(**SPEC_DATACLASS)
class OptimizerSpec:
    name: OptimizerName = OptimizerName.SGD
    """sgd, adam, adamw, adadelta or rmsprop (torch.optim semantics in both backends; see
    docs/parity.md)."""
    lr: float = tagged_field(SHOWS_IN_LR, default=0.05)
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
    """Global-norm clipping of the all-reduced gradient (torch clip_grad_norm_ formula); null:
    off."""
    schedule: ScheduleSpec = tagged_field(SHOWS_IN_LR, default_factory=ScheduleSpec)

    def __post_init__(self) -> None:
        check_field(self.lr > 0, "optimizer.lr", "must be > 0", self.lr)
        check_field(
            0 <= self.momentum < 1, "optimizer.momentum", "must be in [0, 1)", self.momentum
        )
        if self.nesterov:
            check_field(
                self.momentum > 0, "optimizer.nesterov", "needs momentum > 0", self.momentum
            )
        check_field(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optimizer.betas",
            "must be two numbers in [0, 1)",
            list(self.betas),
        )
        if self.eps is None:  # torch's default for this optimizer, written into the resolved spec
            object.__setattr__(self, "eps", OPTIMIZERS[self.name].default_eps)
        assert self.eps is not None  # set just above when it was null
        check_field(self.eps > 0, "optimizer.eps", "must be > 0", self.eps)
        check_field(0 <= self.rho <= 1, "optimizer.rho", "must be in [0, 1]", self.rho)
        check_field(0 <= self.alpha <= 1, "optimizer.alpha", "must be in [0, 1]", self.alpha)
        if self.centered and "centered" not in OPTIMIZERS[self.name].options:
            raise UserError(
                f"optimizer.centered is for rmsprop. Received: centered=true with {self.name.value}"
            )

        check_field(
            self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay
        )
        if self.clip_grad_norm is not None:
            check_field(
                self.clip_grad_norm > 0,
                "optimizer.clip_grad_norm",
                "must be > 0 or null",
                self.clip_grad_norm,
            )


@dataclass(**SPEC_DATACLASS)
class LossScaleSpec:
    init: float = 65536.0
    """Initial loss scale (torch GradScaler default 2**16; Keras uses 2**15)."""
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    """Grow the scale after this many consecutive finite steps."""

    def __post_init__(self) -> None:
        check_field(self.init > 0, "precision.loss_scale.init", "must be > 0", self.init)
        check_field(
            self.growth_factor >= 1,
            "precision.loss_scale.growth_factor",
            "must be >= 1",
            self.growth_factor,
        )
        check_field(
            0 < self.backoff_factor < 1,
            "precision.loss_scale.backoff_factor",
            "must be in (0, 1)",
            self.backoff_factor,
        )
        check_field(
            self.growth_interval >= 1,
            "precision.loss_scale.growth_interval",
            "must be >= 1",
            self.growth_interval,
        )


@dataclass(**SPEC_DATACLASS)
class PrecisionSpec:
    dtype: Precision = Precision.FP32
    """fp32, fp16 (autocast/mixed_float16 + dynamic loss scaling), bf16 (no loss scaling) or fp64
    (float64 everywhere: the reference precision ``dualtrain compare`` checks semantics with)."""
    loss_scale: LossScaleSpec = tagged_field(SHOWS_IN_SCALE, default_factory=LossScaleSpec)


@dataclass(**SPEC_DATACLASS)
class DistributionSpec:
    world_size: int = 1
    """Number of replicas (torch: processes; tf: devices or worker processes)."""
    device: Device = Device.CPU
    """cpu (gloo) or gpu (nccl)."""
    strategy: Strategy = tagged_field(COSMETIC, default=Strategy.ALL_REDUCE)
    """all_reduce, or parameter_server: a synchronous parameter server holds the weights and the
    optimizer and applies one update from the sum of every replica's gradient (the same step;
    docs/strategies.md)."""
    master_addr: str = tagged_field(COSMETIC, default="127.0.0.1")
    """Rendezvous address for locally launched workers."""
    master_port: int | None = tagged_field(COSMETIC, default=None)
    """Rendezvous port; null picks a free one."""
    timeout_s: float = tagged_field(COSMETIC, default=120.0)
    """Bound on startup and on any single collective: a lost peer fails the run instead of
    hanging."""
    threads_per_worker: int | None = tagged_field(COSMETIC, default=None)
    """Intra-op threads per worker process; null: cores // local workers."""
    max_restarts: int = tagged_field(COSMETIC, default=0)
    """When a worker dies (killed, OOM, a lost node), stop the others and restart every worker from
    the latest checkpoint, at most this many times (torchrun's --max-restarts); then fail naming the
    rank. Without checkpoints a restart begins again at step 1."""

    def __post_init__(self) -> None:
        check_field(
            self.world_size >= 1, "distribution.world_size", "must be >= 1", self.world_size
        )
        check_field(
            self.max_restarts >= 0, "distribution.max_restarts", "must be >= 0", self.max_restarts
        )
        check_field(self.timeout_s > 0, "distribution.timeout_s", "must be > 0", self.timeout_s)
        if self.master_port is not None:
            check_field(
                0 < self.master_port < 65536,
                "distribution.master_port",
                "must be in 1..65535",
                self.master_port,
            )
        if self.threads_per_worker is not None:
            check_field(
                self.threads_per_worker >= 1,
                "distribution.threads_per_worker",
                "must be >= 1",
                self.threads_per_worker,
            )


@dataclass(**SPEC_DATACLASS)
class TFSpec:
    strategy: TFStrategy = tagged_field(COSMETIC, default=TFStrategy.MIRRORED)
    """mirrored (one process, N local devices) or multi_worker (N processes, TF_CONFIG)."""


@dataclass(**SPEC_DATACLASS)
class EarlyStoppingSpec:
    """Stop when an evaluation metric has not improved for ``patience`` evaluations (Keras's
    EarlyStopping, Lightning's): decided on the chief from the gathered evaluation, at every
    evaluation (train.eval_every; the end of every epoch by default)."""

    metric: str = "val_loss"
    """The evaluation field to watch: loss or accuracy (mae for an mse model) of the test split,
    or val_loss, val_accuracy, val_mae of the validation split (data.validation)."""
    mode: StopMode = StopMode.AUTO
    """min, max, or auto: max for accuracy, min for loss and mae."""
    patience: int | None = 3
    """Evaluations in a row without an improvement after which the run stops (null: it never
    stops; with train.keep_best, the best weights are still kept)."""
    min_delta: float = 0.0
    """An improvement is a change beyond the best value by more than this."""

    def __post_init__(self) -> None:
        if self.patience is not None:
            check_field(
                self.patience >= 1,
                "train.early_stopping.patience",
                "must be >= 1 or null",
                self.patience,
            )
        check_field(
            self.min_delta >= 0, "train.early_stopping.min_delta", "must be >= 0", self.min_delta
        )


@dataclass(**SPEC_DATACLASS)
class EmaSpec:
    """An exponential moving average of the trainable weights (docs/spec.md)."""

    decay: float = 0.999
    """ema = ema + (1 - decay) * (w - ema) at every update."""
    every: int = 1
    """Update the average every N optimizer steps."""
    start: int = 0
    """Until this optimizer step (and at step 1, as Keras and torch's AveragedModel) the average is
    the weights themselves (a copy); the updates begin after it."""
    evaluate: bool = False
    """Evaluate (test and validation) with the averaged weights instead of the live ones."""

    def __post_init__(self) -> None:
        check_field(0 <= self.decay < 1, "train.ema.decay", "must be in [0, 1)", self.decay)
        check_field(self.every >= 1, "train.ema.every", "must be >= 1", self.every)
        check_field(self.start >= 0, "train.ema.start", "must be >= 0", self.start)


@dataclass(**SPEC_DATACLASS)
class TrainSpec:
    epochs: int | None = 1
    """Number of epochs (null with max_steps: as many as max_steps needs)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (counted across epochs)."""
    eval_every: int = 0
    """Evaluate every N steps; 0: at the end of every epoch. A final evaluation always runs."""
    log_every: int = tagged_field(COSMETIC, FREE, default=50)
    """Progress line and metrics flush every N steps."""
    checkpoint_every: Every | int | None = tagged_field(COSMETIC, FREE, default=None)
    """Write a checkpoint every N steps, or ``epoch``: at the end of every epoch; null: never. A run
    that checkpoints also writes one after its last step (RUN_DIR/checkpoints,
    docs/checkpoints.md)."""
    keep_checkpoints: int = tagged_field(COSMETIC, FREE, default=3)
    """Keep the newest K complete checkpoints; older ones are deleted once a newer one is
    complete."""
    accumulate: int = 1
    """Gradient accumulation: K micro-batches of data.batch_size per optimizer step, the loss of
    each normalised by the sample count of the whole step (so K x B equals one batch of K * B up
    to rounding); steps, the lr schedule, loss scaling, clipping and checkpoints count optimizer
    steps (docs/spec.md)."""
    early_stopping: EarlyStoppingSpec | None = None
    """Stop when an evaluation metric stops improving (null: train every step)."""
    ema: EmaSpec | None = None
    """An exponential moving average of the weights, kept beside them (null: none)."""
    keep_best: bool = False
    """Write RUN_DIR/weights_best.npz whenever train.early_stopping's metric improves (the
    weights of the best evaluation)."""

    def __post_init__(self) -> None:
        if isinstance(self.checkpoint_every, int):
            check_field(
                self.checkpoint_every >= 1,
                "train.checkpoint_every",
                "must be >= 1, epoch or null",
                self.checkpoint_every,
            )
        check_field(
            self.keep_checkpoints >= 1,
            "train.keep_checkpoints",
            "must be >= 1",
            self.keep_checkpoints,
        )
        if self.epochs is None and self.max_steps is None:
            raise UserError("train: give epochs or max_steps. Received: neither")
        if self.epochs is not None:
            check_field(self.epochs >= 1, "train.epochs", "must be >= 1", self.epochs)
        if self.max_steps is not None:
            check_field(self.max_steps >= 1, "train.max_steps", "must be >= 1", self.max_steps)
        check_field(self.eval_every >= 0, "train.eval_every", "must be >= 0", self.eval_every)
        check_field(self.log_every >= 1, "train.log_every", "must be >= 1", self.log_every)
        check_field(self.accumulate >= 1, "train.accumulate", "must be >= 1", self.accumulate)
        if self.keep_best and self.early_stopping is None:
            raise UserError(
                "train.keep_best needs train.early_stopping (its metric and mode say which "
                "evaluation is best; patience: null to never stop). Received: keep_best: true, "
                "early_stopping: null"
            )


@dataclass(**SPEC_DATACLASS)
class LoggingSpec:
    """Where a run reports besides metrics.jsonl (which is always written). Changing it never
    changes the training: a run may resume or continue with other logging settings."""

    tensorboard: bool = True
    """TensorBoard event files from the chief in RUN_DIR/tensorboard (tags train/loss, train/lr,
    train/grad_norm, train/loss_scale, train/samples_per_s, eval/loss, eval/accuracy; the same on
    both backends)."""
    progress: Progress = Progress.AUTO
    """auto: a live progress bar when the chief writes to an interactive terminal, plain lines
    otherwise (log files, CI); bar: always the bar; lines: always plain lines."""


@dataclass(**SPEC_DATACLASS)
class DebugSpec:
    """Inspection and fault injection, for tests and debugging. Leave empty in real runs."""

    dump_grads: tuple[int, ...] = tagged_field(COSMETIC, default=())
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


@dataclass(**SPEC_DATACLASS)
class Experiment:
    name: str = tagged_field(COSMETIC, FREE, default="experiment")
    """Run name, used in the default output directory."""
    seed: int = tagged_field(SHOWS_IN_IDS, SHOWS_IN_INIT, default=0)
    """Seeds the data order and the initial weights."""
    data: DataSpec = tagged_field(SHOWS_IN_IDS, default_factory=DataSpec)
    model: ModelSpec = field(default_factory=lambda: ModelSpec(preset="mlp"))
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    distribution: DistributionSpec = tagged_field(FREE, default_factory=DistributionSpec)
    tf: TFSpec = tagged_field(FREE, default_factory=TFSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    determinism: bool = True
    """Deterministic kernels in both frameworks, TF32 off (see docs/parity.md)."""
    output_dir: str = tagged_field(COSMETIC, FREE, default="runs")
    """Parent folder of run directories (``--out`` names the run directory itself)."""
    logging: LoggingSpec = tagged_field(COSMETIC, FREE, default_factory=LoggingSpec)
    debug: DebugSpec = tagged_field(FREE, default_factory=DebugSpec)

    def __post_init__(self) -> None:
        check_field(
            bool(self.name) and "/" not in self.name,
            "name",
            "must be a non-empty name without '/'",
            self.name,
        )
        check_field(0 <= self.seed < 2**32, "seed", "must be in [0, 2**32)", self.seed)
        stop = self.train.early_stopping
        if stop is not None:
            metric = METRICS[self.model.loss]
            known = ["loss", metric]
            if self.data.validation is not None or self.data.validation_ids:
                known += ["val_loss", f"val_{metric}"]
            if stop.metric not in known:
                hint = (
                    " (the validation fields need data.validation)"
                    if stop.metric.startswith("val_") and len(known) == 2
                    else ""
                )
                raise UserError(
                    f"train.early_stopping.metric must be one of {known}{hint}. Received: "
                    f"{stop.metric!r}"
                )
        if self.data.sharding is Sharding.TORCH_SAMPLER:
            check_field(
                self.data.batch_size % self.distribution.world_size == 0,
                "data.batch_size",
                f"must be a multiple of world_size={self.distribution.world_size} with "
                "sharding=torch_sampler",
                self.data.batch_size,
            )
            check_field(
                self.train.accumulate == 1,
                "train.accumulate",
                "must be 1 with sharding=torch_sampler (each rank's DataLoader batches are the "
                "steps; use sharding: exact to accumulate)",
                self.train.accumulate,
            )

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def replace(self, **changes: Any) -> Experiment:
        return dataclasses.replace(self, **changes)


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, LayerSpec):  # a layer names only what it sets: {type: dense, units: 10}
        return {
            f.name: _to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.name == "type" or getattr(obj, f.name) != f.default
        }
    if isinstance(obj, ModelSpec):  # a model pair's fields, or dualtrain's layers: not both
        skip = ("preset", "layers") if obj.is_pair else ModelSpec.PAIR_FIELDS
        return {
            f.name: _to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.name not in skip
        }
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    return obj
