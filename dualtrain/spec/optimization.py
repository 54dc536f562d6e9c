"""The optimizer section and its lr schedule (the optimizer's options; each optimizer itself is
declared once in :mod:`dualtrain.spec.optimizers`)."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.errors import UserError
from dualtrain.spec.fields import SHOWS_IN_LR, SPEC_DATACLASS, check_field, tagged_field
from dualtrain.spec.optimizers import OPTIMIZERS
from dualtrain.spec.vocab import OptimizerName, ScheduleInterval, ScheduleName


@dataclass(**SPEC_DATACLASS)
class ScheduleSpec:
    name: ScheduleName = ScheduleName.CONSTANT
    """constant; step: ``lr * gamma ** (step // step_size)``; or cosine: down to ``min_lr`` over
    the run."""
    step_size: int = 1000
    """step: optimizer steps between decays."""
    gamma: float = 0.1
    """step: decay factor."""
    min_lr: float = 0.0
    """cosine: final learning rate."""
    warmup_steps: int = 0
    """Linear warmup from lr/warmup_steps to lr over this many steps."""
    interval: ScheduleInterval = ScheduleInterval.STEP
    """step: the lr changes every optimizer step. epoch: once per epoch, as torch's StepLR or
    CosineAnnealingLR stepped after each epoch; ``step_size`` and ``warmup_steps`` then count
    epochs. pytorch/examples' mnist has
    ``{name: step, step_size: 1, gamma: 0.7, interval: epoch}``."""

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
    """The optimizer, with torch.optim's semantics on both backends. docs/parity.md §4."""
    lr: float = tagged_field(SHOWS_IN_LR, default=0.05)
    """Peak learning rate."""
    momentum: float = 0.0
    """sgd and rmsprop: momentum, in torch's form: ``buf = m*buf + g; p -= lr*buf``. Other
    optimizers ignore it."""
    nesterov: bool = False
    """sgd: Nesterov momentum. It needs momentum > 0."""
    betas: tuple[float, float] = (0.9, 0.999)
    """adam, adamw, adamax: (beta1, beta2)."""
    eps: float | None = None
    """adam, adamw: added to ``sqrt(v_hat)``. adamax: to ``abs(g)`` inside the infinity norm.
    rmsprop: to ``sqrt(square_avg)``. adadelta: inside both square roots. These are torch's
    placements. null: torch's default for the optimizer, 1e-8 or adadelta's 1e-6, written into
    the resolved spec.yaml."""
    rho: float = 0.9
    """adadelta: decay of the squared-gradient and squared-update averages."""
    alpha: float = 0.99
    """rmsprop: decay of the squared-gradient average."""
    centered: bool = False
    """rmsprop: divide by the centered second moment, ``square_avg - grad_avg**2``."""
    weight_decay: float = 0.0
    """sgd, adam, adamax, adadelta, rmsprop: L2 added to the gradient. adamw: decoupled,
    ``p *= 1 - lr*wd``."""
    clip_grad_norm: float | None = None
    """Global-norm clipping of the all-reduced gradient, with torch's ``clip_grad_norm_`` formula.
    null: off."""
    schedule: ScheduleSpec = tagged_field(SHOWS_IN_LR, default_factory=ScheduleSpec)
    """The learning-rate schedule over the run."""

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
