"""How a run executes, not what it trains: the precision section (and fp16's dynamic loss
scaling), the distribution section (replicas, device, strategy, rendezvous, restarts) and the TF
strategy."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.spec.fields import (
    COSMETIC,
    SHOWS_IN_SCALE,
    SPEC_DATACLASS,
    check_field,
    tagged_field,
)
from dualtrain.spec.vocab import Device, Precision, Strategy, TFStrategy


@dataclass(**SPEC_DATACLASS)
class LossScaleSpec:
    init: float = 65536.0
    """Initial loss scale: torch GradScaler's default ``2**16``; Keras uses ``2**15``."""
    growth_factor: float = 2.0
    """After ``growth_interval`` finite steps in a row, the scale is multiplied by this."""
    backoff_factor: float = 0.5
    """A step whose all-reduced gradient is not finite is skipped, and the scale is multiplied by
    this."""
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
    """fp32; fp16: autocast or mixed_float16, with dynamic loss scaling; bf16: no loss scaling.
    fp64: float64 parameters, activations, loss, gradients and optimizer state on both backends.
    fp64 is the reference precision ``dualtrain compare`` checks semantics with. Its
    ``weights_final.npz`` holds float64 arrays."""
    loss_scale: LossScaleSpec = tagged_field(SHOWS_IN_SCALE, default_factory=LossScaleSpec)
    """fp16's dynamic loss scaling, GradScaler's rule on both backends."""


@dataclass(**SPEC_DATACLASS)
class DistributionSpec:
    world_size: int = 1
    """Number of replicas. torch: processes; tf: devices or worker processes."""
    device: Device = Device.CPU
    """cpu, with gloo, or gpu, with nccl."""
    strategy: Strategy = tagged_field(COSMETIC, default=Strategy.ALL_REDUCE)
    """all_reduce, or parameter_server: a synchronous parameter server holds the weights and the
    optimizer. It applies one update from the sum of every replica's gradient: the same step. On
    torch it is a server process on ``torch.distributed.rpc``. On tf it is
    ``ParameterServerStrategy`` with a ``ClusterCoordinator``. It runs on CPU.
    docs/strategies.md#the-parameter_server-strategy."""
    master_addr: str = tagged_field(COSMETIC, default="127.0.0.1")
    """Rendezvous address for locally launched workers."""
    master_port: int | None = tagged_field(COSMETIC, default=None)
    """Rendezvous port; null picks a free one."""
    timeout_s: float = tagged_field(COSMETIC, default=120.0)
    """Bound on startup and on any single collective: a lost peer fails the run instead of
    hanging."""
    threads_per_worker: int | None = tagged_field(COSMETIC, default=None)
    """Intra-op threads per worker process; null: cores // local workers."""
    bind_cores: bool = tagged_field(COSMETIC, default=True)
    """On a CPU, a host's local worker processes each run on cores of their own where two or more
    fit. Each takes ``threads_per_worker`` of the cores this host's launcher may use, in
    local-rank order. So no worker's threads share a core with another's. false: the OS places
    them. summary.json records the chief's ``cpu_affinity``."""
    max_restarts: int = tagged_field(COSMETIC, default=0)
    """When a worker dies, killed, out of memory or on a lost node, stop the others. Then restart
    every worker from the latest checkpoint, at most this many times, as torchrun's
    ``--max-restarts``. After that, fail naming the rank. Without checkpoints a restart begins
    again at step 1. A worker that stops on a user error, exit 2, is not restarted.
    docs/checkpoints.md."""

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
    """mirrored: one process, N local devices. multi_worker: N processes, with TF_CONFIG."""
