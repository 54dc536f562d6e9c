"""The train section (epochs, steps, cadence, accumulation) with its early stopping and weight
averaging, and the run's logging and debug sections."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.errors import UserError
from dualtrain.spec.fields import COSMETIC, FREE, SPEC_DATACLASS, check_field, tagged_field
from dualtrain.spec.vocab import Every, Progress, StopMode


@dataclass(**SPEC_DATACLASS)
class EarlyStoppingSpec:
    """Stop when an evaluation metric has not improved for ``patience`` evaluations (Keras's
    EarlyStopping, Lightning's): decided on the chief from the gathered evaluation, at every
    evaluation (train.eval_every; the end of every epoch by default)."""

    metric: str = "val_loss"
    """The evaluation field to watch: ``loss`` or ``accuracy`` of the test split, ``mae`` for an
    mse or huber model. Or ``val_loss``, ``val_accuracy`` or ``val_mae`` of the validation split,
    with ``data.validation``."""
    mode: StopMode = StopMode.AUTO
    """min, max, or auto: max for accuracy, min for loss and mae."""
    patience: int | None = 3
    """Evaluations in a row without an improvement after which the run stops. null: never stop;
    with ``train.keep_best``, only keep the best weights."""
    min_delta: float = 0.0
    """An improvement beats the best value by more than this."""

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
    """``ema <- ema + (1 - decay) * (w - ema)`` at every update."""
    every: int = 1
    """Update the average every N optimizer steps, counted from ``start``."""
    start: int = 0
    """Until this optimizer step, and at step 1, the average is a copy of the weights, as in Keras
    and torch's AveragedModel. The updates begin after it."""
    evaluate: bool = False
    """Evaluate, test and validation, with the averaged weights instead of the live ones."""

    def __post_init__(self) -> None:
        check_field(0 <= self.decay < 1, "train.ema.decay", "must be in [0, 1)", self.decay)
        check_field(self.every >= 1, "train.ema.every", "must be >= 1", self.every)
        check_field(self.start >= 0, "train.ema.start", "must be >= 0", self.start)


@dataclass(**SPEC_DATACLASS)
class TrainSpec:
    epochs: int | None = 1
    """Number of epochs. null with ``max_steps``: as many as ``max_steps`` needs."""
    max_steps: int | None = None
    """Stop after this many optimizer steps, counted across epochs."""
    eval_every: int = 0
    """Evaluate every N steps; 0: at the end of every epoch. A final evaluation always runs."""
    log_every: int = tagged_field(COSMETIC, FREE, default=50)
    """Progress line and metrics flush every N steps."""
    checkpoint_every: Every | int | None = tagged_field(COSMETIC, FREE, default=None)
    """Write a checkpoint every N steps, or ``epoch``: at the end of every epoch. null: never. A
    run that checkpoints also writes one after its last step, in RUN_DIR/checkpoints.
    docs/checkpoints.md."""
    keep_checkpoints: int = tagged_field(COSMETIC, FREE, default=3)
    """Keep the newest K complete checkpoints; older ones are deleted once a newer one is
    complete."""
    accumulate: int = 1
    """Gradient accumulation: K micro-batches of ``data.batch_size`` per optimizer step. Each
    one's loss is normalised by the sample count of the whole step. So K micro-batches of B equal
    one batch of K·B up to rounding. Steps, the lr schedule, loss scaling, clipping and
    checkpoints count optimizer steps. docs/spec.md#gradient-accumulation-trainaccumulate-k."""
    early_stopping: EarlyStoppingSpec | None = None
    """Stop when an evaluation metric stops improving: ``{metric, mode, patience, min_delta}``.
    null: train every step.
    docs/spec.md#early-stopping-trainearly_stopping-and-the-best-weights-trainkeep_best."""
    ema: EmaSpec | None = None
    """An exponential moving average of the weights, kept beside them:
    ``{decay, every, start, evaluate}``. null: none.
    docs/spec.md#the-average-of-the-weights-trainema."""
    keep_best: bool = False
    """Write ``RUN_DIR/weights_best.npz`` whenever ``early_stopping``'s metric improves: the
    weights of the best evaluation. It needs ``early_stopping``."""

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
    """TensorBoard event files from the chief in RUN_DIR/tensorboard, the same on both backends.
    The tags: train/loss, train/lr, train/grad_norm, train/loss_scale, train/samples_per_s,
    eval/loss, and eval/accuracy or eval/mae. With a validation split also validation/loss, and
    validation/accuracy or validation/mae."""
    progress: Progress = Progress.AUTO
    """auto: a live progress bar when the chief writes to an interactive terminal, not TERM=dumb,
    not CI. Plain lines otherwise: log files, CI. bar: always the bar. lines: always plain
    lines."""


@dataclass(**SPEC_DATACLASS)
class DebugSpec:
    """Inspection and fault injection, for tests and debugging. Leave empty in real runs."""

    dump_grads: tuple[int, ...] = tagged_field(COSMETIC, default=())
    """Steps, 1-based, whose all-reduced, unscaled, unclipped gradient the chief saves as
    ``grads_step{N}.npz``, in the canonical layout."""
    dump_layers: tuple[int, ...] = tagged_field(COSMETIC, default=())
    """Steps, 1-based, at which the chief saves every layer's output before the step's update. It
    takes its first replica's batch, in training and in inference, with each sample's loss. They
    go to ``layers_step{N}.npz`` in canonical layouts: dualtrain.parity.taps. Compare's replay
    asks for it. dualtrain's own layers only, not a model pair nor synchronised batchnorm at
    world > 1."""
    stop_after: int | None = None
    """The run ends after this step, 1-based, as after its last. It runs a final evaluation and,
    where it checkpoints, writes a checkpoint. The learning rate's schedule stays the whole run's.
    A replay that continues a checkpoint up to one step uses it. The train length must stay the
    checkpoint's."""
    nonfinite_grad: tuple[tuple[int, int], ...] = ()
    """(step, replica) pairs: that replica's local gradient is set to inf at that step."""
    exit_rank: tuple[int, int] | None = None
    """(step, rank): that worker process kills itself with SIGKILL at that step. Only in the run's
    first attempt, unless ``exit_every_attempt``: a restarted or resumed run does not fail
    again."""
    exit_every_attempt: bool = False
    """``exit_rank`` fires in every attempt, for tests of ``max_restarts`` running out."""
    crash_in_checkpoint: int | None = None
    """Step whose checkpoint write the chief dies in, in the first attempt only. It dies by
    SIGKILL after the weights file, before the manifest."""

    def __post_init__(self) -> None:
        if self.stop_after is not None:
            check_field(self.stop_after >= 1, "debug.stop_after", "must be >= 1", self.stop_after)
