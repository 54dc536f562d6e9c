"""What the torch engine's parts share: the module and its DDP wrapper, the optimizer and the loss
scaler, the precision, the process group's view (rank, world, device) and the count of applied
updates. Built once by :class:`~dualtrain.backends.torch.engine.TorchEngine`; its parts (the
forward: forward.py, the update: update.py, the step: step.py) each take it, and each other, in
their constructors."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.backends.torch.layers import HashDropout
from dualtrain.core.data.dataset import Data
from dualtrain.core.pair.dropout import DropoutEntry
from dualtrain.spec import Experiment, Loss


class HookState:
    """What the DDP comm hook reads: whether to poison this replica's gradient (fault
    injection)."""

    __slots__ = ("poison",)

    def __init__(self) -> None:
        self.poison = False


def sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations as real types
    """SUM all-reduce (no division); fault injection turns this replica's local gradient to inf
    first, so the overflow reaches the other replicas only through the all-reduce."""
    buf = bucket.buffer()
    if state.poison:
        buf.fill_(float("inf"))
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda fut: fut.value()[0])


@dataclass(eq=False)
class TorchState:
    """One replica's (or the parameter server's) training state on the torch backend."""

    spec: Experiment
    data: Data
    rank: int
    world: int
    device: torch.device
    dtype: torch.dtype
    """float64 for fp64, else float32 (fp16 and bf16 autocast on top)."""
    module: torch.nn.Module
    ddp: torch.nn.Module
    """DistributedDataParallel around ``module``, or the module itself where nothing
    all-reduces."""
    opt: torch.optim.Optimizer
    autocast: contextlib.AbstractContextManager[object]
    scaler: torch.amp.GradScaler | None
    server: bool
    """A replica of distribution.strategy: parameter_server (its gradient goes to the server)."""
    dropouts: list[HashDropout]
    pair_dropouts: tuple[DropoutEntry, ...]
    """A model pair's dropout calls (model_pair.json), in forward order."""
    params: list[torch.nn.Parameter]
    names: list[str]
    """The parameters' names in the module (its named_parameters order)."""
    hook: HookState = field(default_factory=HookState)
    broadcast: list[torch.Tensor] = field(default_factory=list)
    """Unsync batchnorm's running statistics, rank 0's broadcast after every step."""
    applied: int = 0
    """Updates applied (skipped fp16 steps excluded): the checkpoints' count."""
    local_replicas: Sequence[int] = field(default=())

    @property
    def loss(self) -> Loss:
        return self.spec.model.loss

    @property
    def accumulate(self) -> int:
        return self.spec.train.accumulate

    @property
    def seed(self) -> int:
        """The dropout masks' (dualtrain.core.dropout)."""
        return self.spec.seed

    @property
    def clip(self) -> float | None:
        return self.spec.optimizer.clip_grad_norm

    @property
    def eval_batch(self) -> int:
        return max(1, self.spec.data.eval_batch_size // self.world)

    def batch(
        self, split: str, positions: np.ndarray | slice
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The inputs (parameter dtype) and targets of these samples, on the device."""
        xs = [
            torch.from_numpy(a).to(self.device, self.dtype)
            for a in self.data.inputs(split, positions)
        ]
        y = torch.from_numpy(self.data.targets(split, positions))
        y = y.to(self.device) if y.dtype == torch.int64 else y.to(self.device, self.dtype)
        return xs, y
