"""The torch Engine: DDP (gloo on CPU, nccl on GPU) with a SUM all-reduce, autocast + GradScaler.

One training step follows docs/architecture.md "One step, defined once":

* the replica takes exactly the plan's ids from the data (dualtrain.core.data: the same float32
  rows on both backends, read from memory-mapped files where the data is .npy files);
* it differentiates ``sum(per-sample loss) / N_global`` (times the loss scale in fp16);
* DDP all-reduces the gradients with a **SUM** comm hook. With a comm hook registered the reducer
  copies gradients into its buckets without dividing by the world size (reducer.cpp
  ``mark_variable_ready_dense``), so the result is the gradient of the global-batch mean even for a
  partial batch or an empty replica (tests/integration/test_torch_grad_average.py checks it
  against world 1);
* the scaler unscales the all-reduced gradient and decides skip/apply (every rank sees the same
  gradient, so the same verdict); grad_norm and clipping use the all-reduced, unscaled gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dualtrain.backends.torch import ps
from dualtrain.backends.torch.forward import ForwardPass
from dualtrain.backends.torch.model import (
    BatchNorm,
    HashDropout,
    build_model,
    export_canonical,
    load_canonical,
)
from dualtrain.backends.torch.optimizer import (
    load_optimizer_state,
    make_optimizer,
    optimizer_state,
)
from dualtrain.backends.torch.pair import (
    batchnorms,
    build_module,
    canonical_state,
    load_pair,
    unused_parameters,
    zero_exact_zeros,
)
from dualtrain.backends.torch.precision import precision_setup
from dualtrain.backends.torch.state import HookState, TorchState, sum_hook
from dualtrain.backends.torch.step import TrainStep
from dualtrain.backends.torch.update import GradientUpdate
from dualtrain.core import ema as ema_rule
from dualtrain.core import pair
from dualtrain.core.data.dataset import Data
from dualtrain.core.weights import Weights
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.runtime.engine import BuiltFromParts, Engine
from dualtrain.spec import OPTIMIZERS, Experiment, Precision

#: DDP without its buffer broadcast before every forward (replica 0's batchnorm statistics are
#: dualtrain's own rule, docs/parity.md §9): torch 2.13's forward_sync_buffers=False (buffers
#: synced once at construction); before 2.13 broadcast_buffers=False, which also skips that first
#: sync, a no-op here since every rank loads the same recorded weights and buffers. Found on a GPU
#: machine whose torch 2.11 refused the newer keyword, inside pyproject's torch>=2.3 range.
NO_FORWARD_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


class TorchEngine(BuiltFromParts, Engine):
    """Built from parts on one :class:`TorchState`: the forward (forward.py), the update
    (update.py) and the step (step.py); the weights, their average and checkpoints are here."""

    backend = "torch"

    def __init__(
        self,
        spec: Experiment,
        data: Data,
        weights: Weights,
        *,
        rank: int,
        world: int,
        device: torch.device,
        server: bool = False,
        serve: bool = False,
        layout: pair.Layout | None = None,
    ):
        """``server``: a replica of distribution.strategy: parameter_server (its gradients go to
        the server, not into an all-reduce: dualtrain.backends.torch.ps); ``serve``: the server's
        own engine (no process group, no data: it only updates); ``layout``: a model pair's
        (model_pair.json: its dropout calls take the pair's masks)."""
        self.spec = spec
        self.rank = rank
        self.local_replicas: Sequence[int] = (rank,)
        self._pg_device = device  # gloo collectives on CPU tensors, nccl on CUDA tensors
        self._pair = spec.model.is_pair
        self._ema: list[torch.Tensor] | None = None  # train.ema's average (ema())
        self.state = self._build(spec, data, weights, rank, world, device, server, serve, layout)
        self.forward = ForwardPass(self.state)
        self.grads = GradientUpdate(self.state)
        self.steps = TrainStep(self.state, self.forward, self.grads)
        if serve and self.state.scaler is not None:
            # the server unscales gradients it never scaled: GradScaler's scale starts on first use
            self.state.scaler.scale(torch.zeros((), dtype=self.state.dtype, device=device))
        if world > 1 and not (server or serve):
            self.steps.settle_buckets()

    def _build(
        self,
        spec: Experiment,
        data: Data,
        weights: Weights,
        rank: int,
        world: int,
        device: torch.device,
        server: bool,
        serve: bool,
        layout: pair.Layout | None,
    ) -> TorchState:
        # fp64: float64 parameters, activations, loss and optimizer state (the inputs are the same
        # float32-normalised images, widened exactly). Otherwise float32 (fp16/bf16 autocast on
        # top).
        dtype = torch.float64 if spec.precision.dtype is Precision.FP64 else torch.float32
        # dualtrain's layers, or a model pair's torch module (its initial values are replaced by
        # the run's recorded ones just below)
        module = (
            build_module(spec.model, spec.seed)
            if spec.model.is_pair
            else build_model(spec.model, spec.seed)
        ).to(dtype)
        self.load_weights_into(module, weights)
        if layout is not None:
            zero_exact_zeros(module, layout)
        module = module.to(device)
        hook = HookState()
        ddp: torch.nn.Module = module  # the module itself where no all-reduce runs
        if not (server or serve):
            ddp = DDP(
                module,
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True,
                # a pair's module may hold parameters its forward does not use (Hugging Face's
                # BERT pooler under a head on the tokens): DDP then looks for them each step
                find_unused_parameters=layout is not None and bool(unused_parameters(module, spec)),
                **NO_FORWARD_BUFFER_SYNC,
            )
            # A Python comm hook, not the builtin ALLREDUCE one: with the builtin hook the gradient
            # still comes out divided by the world size (measured on torch 2.13), with a Python
            # hook it does not.
            ddp.register_comm_hook(hook, sum_hook)
        params = [p for _, p in module.named_parameters()]
        autocast, scaler = precision_setup(spec.precision, device.type)
        return TorchState(
            spec=spec,
            data=data,
            rank=rank,
            world=world,
            device=device,
            dtype=dtype,
            module=module,
            ddp=ddp,
            opt=make_optimizer(spec, params),
            autocast=autocast,
            scaler=scaler,
            server=server,
            dropouts=[m for m in module.modules() if isinstance(m, HashDropout)],
            pair_dropouts=layout.dropouts if layout is not None else (),
            params=params,
            names=[n for n, _ in module.named_parameters()],
            hook=hook,
            broadcast=self._batchnorm_collectives(module, world),
        )

    def _batchnorm_collectives(self, module: torch.nn.Module, world: int) -> list[torch.Tensor]:
        """The batchnorm layers' collectives: the sync layers' process group, and the running
        statistics every replica takes from rank 0 after each step (returned; broadcast in
        step.py)."""
        # BatchNorm (dualtrain.core.batchnorm): sync layers all-reduce their sums in a group of
        # their own (never interleaved with DDP's gradient buckets); unsync layers' running
        # statistics are rank 0's, broadcast after every step.
        norms = [m for m in module.modules() if isinstance(m, BatchNorm)]
        if world > 1 and any(m.sync for m in norms):
            group = dist.new_group(backend=dist.get_backend())
            for m in norms:
                m.group = group if m.sync else None
        broadcast = [
            b for m in norms if not m.sync and world > 1 for b in (m.running_mean, m.running_var)
        ]
        if self._pair and world > 1:  # a pair's own BatchNorm layers: replica 0's, the same rule
            broadcast += [
                cast(torch.Tensor, b)
                for m in batchnorms(module)
                for b in (m.running_mean, m.running_var)
            ]
        return broadcast

    # ---- the server's update (the step, evaluation and the taps: runtime.engine.BuiltFromParts) -
    def server_update(self, total: torch.Tensor, lr: float, capture_grads: bool) -> ps.Outcome:
        """The parameter server's update from the replicas' summed gradient (flattened)."""
        return self.grads.server_update(total, lr, capture_grads)

    # ---- collectives, weights ------------------------------------------------------------------
    def gather(self, rows: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(rows)).to(self._pg_device)
        out = [torch.empty_like(t) for _ in range(self.state.world)]
        dist.all_gather(out, t)
        return np.stack([o.cpu().numpy() for o in out])

    def weights(self) -> Weights:
        if self._pair:
            return {
                k: v.detach().cpu().numpy().copy()
                for k, v in canonical_state(self.state.module).items()
            }
        return export_canonical(self.state.module)

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    # ---- the average of the weights (train.ema; dualtrain.core.ema) ------------------------------
    @torch.no_grad()
    def ema(self, action: str, decay: float) -> None:
        if action == ema_rule.COPY or self._ema is None:
            self._ema = [p.detach().clone() for p in self.state.params]
            return
        for e, p in zip(self._ema, self.state.params, strict=True):
            e.add_(p - e, alpha=1.0 - decay)  # dualtrain.core.ema.update

    @torch.no_grad()
    def ema_weights(self) -> Weights:
        assert self._ema is not None  # ema() ran before (the loop starts it)
        live = [p.detach().clone() for p in self.state.params]
        for p, e in zip(self.state.params, self._ema, strict=True):
            p.copy_(e)
        try:
            return self.weights()  # the averaged parameters, the live running statistics
        finally:
            for p, w in zip(self.state.params, live, strict=True):
                p.copy_(w)

    @torch.no_grad()
    def load_ema(self, weights: Weights) -> None:
        live = {k: v.detach().clone() for k, v in self.state.module.state_dict().items()}
        self.load_weights_into(self.state.module, weights)  # this replica's copy only
        self._ema = [p.detach().clone() for p in self.state.params]
        self.state.module.load_state_dict(live)

    # ---- checkpoints -----------------------------------------------------------------------------
    def optimizer_state(self) -> OptimizerState:
        if self.state.server:  # the optimizer that updates is the parameter server's
            return ps.call("optimizer_state")
        return optimizer_state(
            self.state.opt,
            self.state.names,
            self.state.params,
            self.state.applied,
            self.state.scaler,
        )

    def load_weights(self, weights: Weights) -> None:
        self.load_weights_into(self.state.module, weights)
        if (
            self.state.server and self.rank == 0
        ):  # the server's copy, which the next update starts from
            ps.call("load_weights", weights)

    def load_weights_into(self, module: torch.nn.Module, weights: Weights) -> None:
        (load_pair if self._pair else load_canonical)(module, weights)

    def load_optimizer_state(self, state: OptimizerState) -> None:
        load_optimizer_state(
            self.state.opt,
            self.state.names,
            self.state.params,
            self.state.scaler,
            state,
            counted=OPTIMIZERS[self.spec.optimizer.name].counts_steps,
            device=self.state.device,
            dtype=self.state.dtype,
        )
        self.state.applied = state.applied
        if self.state.server and self.rank == 0:  # the optimizer that updates is the server's
            ps.call("load_optimizer_state", state)
