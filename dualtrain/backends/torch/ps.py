"""distribution.strategy: parameter_server on torch: a synchronous parameter server on
``torch.distributed.rpc`` (docs/strategies.md).

The server is a process of its own (the launcher's last worker, ``DUALTRAIN_ROLE=parameter_server``)
holding the module, ``torch.optim`` and ``GradScaler``: a :class:`TorchEngine` built with
``serve=True`` (no process group, no data). Every step each replica sends it the gradient of its
shard's ``sum(loss) / N_global`` (times the loss scale under fp16), flattened, with ``rpc_sync``;
:func:`server_step` (``@rpc.functions.async_execution``) keeps it until all W are in, sums them in
replica order, then the last arrival runs the engine's update (unscale and skip, norm, clipping,
the optimizer, the loss scale: :meth:`GradientUpdate.update`, the very code an all-reduce step
runs) and answers every replica with the new parameters and the step's outcome. The replicas keep
their own gloo process group for evaluation, gathers and batchnorm statistics (replica 0's), as in
an all-reduce run. PyTorch's batch-updating parameter-server tutorial is the pattern; the division
by the number of trainers it makes is not: dualtrain's loss is already normalised by the global
count.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed.rpc as rpc

from dualtrain.backends.torch.launch import PS_ENV

SERVER = "ps"


def replica_name(rank: int) -> str:
    return f"replica{rank}"


@dataclass(frozen=True)
class Outcome:
    """What the server answers every replica after an update."""

    params: torch.Tensor
    """The parameters after the step, flattened in the module's parameter order."""
    grad_norm: float
    grad_amax: float | None
    loss_scale: float
    """The scale this step's gradients carried (1.0 unless fp16)."""
    next_scale: float
    """The scale of the next step (GradScaler's rule after this one)."""
    skipped: bool
    grads: dict[str, np.ndarray] | None
    """The summed, unscaled gradient by name, when a replica asked for it (probes, dump_grads)."""


def init(rank: int, world: int, timeout_s: float, *, server: bool) -> None:
    """Join the RPC group: the W replicas (RPC ranks 0..W-1) and the server (rank W)."""
    if os.environ.get("GLOO_SOCKET_IFNAME") and not os.environ.get("TP_SOCKET_IFNAME"):
        os.environ["TP_SOCKET_IFNAME"] = os.environ["GLOO_SOCKET_IFNAME"]
    options = rpc.TensorPipeRpcBackendOptions(init_method=os.environ[PS_ENV], rpc_timeout=timeout_s)
    with warnings.catch_warnings():
        # init_rpc's own gloo group trips torch's "Backend ... as a ProcessGroup" deprecation
        # warning inside torch (2.13): nothing the user can act on
        warnings.filterwarnings("ignore", message="You are using a Backend")
        rpc.init_rpc(
            SERVER if server else replica_name(rank),
            rank=world if server else rank,
            world_size=world + 1,
            rpc_backend_options=options,
        )


def shutdown(who: str) -> None:
    """Leave together: returns once every replica and the server have finished (graceful).

    Called only once training is over: every replica has passed its last collective
    (backends/torch/cluster.py's leave_together) and the server has answered every step, so nothing
    the run computed depends on it. torch's graceful shutdown then polls the RPC group's store,
    which replica 0's process hosts, and the last process to leave can close it under another
    one's poll ("Connection reset by peer": seen once in CI, under load, at world 3). Such an error
    here is reported in one line and the process ends normally; before the end of training an RPC
    error still fails the run (a replica's step raises it), and a replica that fails exits non-zero
    whatever the server does."""
    try:
        rpc.shutdown(graceful=True)
    except RuntimeError as exc:  # torch.distributed's DistError is one
        print(
            f"[torch] {who}: the RPC group's teardown after training: {exc} (training had "
            f"finished on every replica; nothing is lost)",
            file=sys.stderr,
            flush=True,
        )


class Updater(Protocol):
    """What the server needs of its engine: an update from the replicas' summed gradient (and,
    through :func:`serve_call`, the engine's other methods by name)."""

    def server_update(self, total: torch.Tensor, lr: float, capture_grads: bool) -> Outcome: ...


class Server:
    """The server's state in its process: the engine that updates, and the step being gathered."""

    def __init__(self, engine: Updater, world: int):
        self.engine = engine
        self.world = world
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[torch.Tensor, float, bool]] = {}
        # untyped: torch's stubs type set_exception's argument as the result type
        self.future: torch.futures.Future[Any] = torch.futures.Future()

    def add(
        self, replica: int, grads: torch.Tensor, lr: float, capture: bool
    ) -> torch.futures.Future[Outcome]:
        with self.lock:
            if replica in self.pending:
                raise RuntimeError(f"replica {replica} sent two gradients for one step")
            self.pending[replica] = (grads, lr, capture)
            fut = self.future
            if len(self.pending) == self.world:
                pending = [self.pending[r] for r in range(self.world)]
                self.pending = {}
                self.future = torch.futures.Future()
                try:
                    fut.set_result(self._update(pending))
                except Exception as exc:  # the replicas see it, not a hang
                    fut.set_exception(exc)
        return fut

    def _update(self, pending: list[tuple[torch.Tensor, float, bool]]) -> Outcome:
        """One update from every replica's gradient sum: summed in replica order, whatever order
        they came in; the replicas must agree on the step's learning rate and whether it is
        captured (they compute both from the same step number), else they are out of step."""
        settings = {(lr, capture) for _, lr, capture in pending}
        if len(settings) != 1:
            raise RuntimeError(
                f"the replicas disagree on the step's (learning rate, capture): {sorted(settings)}"
            )
        ((lr, capture),) = settings
        total = pending[0][0].clone()
        for grads, _, _ in pending[1:]:
            total.add_(grads)
        return self.engine.server_update(total, lr, capture)


_SERVER: Server | None = None


@rpc.functions.async_execution
def server_step(
    replica: int, grads: torch.Tensor, lr: float, capture: bool
) -> torch.futures.Future[Outcome]:
    assert _SERVER is not None, "server_step runs in the parameter server's process"
    return _SERVER.add(replica, grads, lr, capture)


def serve(engine: Updater, world: int, timeout_s: float) -> None:
    """The server process: answer the replicas' steps until every one of them has finished."""
    global _SERVER
    _SERVER = Server(engine, world)
    init(world, world, timeout_s, server=True)
    shutdown("parameter server")


def serve_call(method: str, *args: Any) -> Any:
    """The server's engine's ``method`` (weights and optimizer state in and out: probes,
    checkpoints, resume). Replica 0 asks before it sends its next gradient, so no update can
    start before it is done (other replicas' gradients may be waiting: they are not applied yet)."""
    assert _SERVER is not None, "serve_call runs in the parameter server's process"
    with _SERVER.lock:
        return getattr(_SERVER.engine, method)(*args)


def call(method: str, *args: Any) -> Any:
    """A replica's request for :func:`serve_call` (synchronous)."""
    return rpc.rpc_sync(SERVER, serve_call, args=(method, *args))


def step(rank: int, grads: torch.Tensor, lr: float, capture: bool) -> Outcome:
    """A replica's half of a step: send its gradient, wait for the update, get its outcome."""
    return rpc.rpc_sync(SERVER, server_step, args=(rank, grads, lr, capture))
