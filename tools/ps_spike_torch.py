"""The torch half of tools/ps_spike.py: torch.distributed.rpc, PyTorch's batch-updating
parameter-server pattern (rank 0 the parameter server, ranks 1..W the trainers)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F

from dualtrain.backends.torch.model import build_model, export_canonical, load_canonical
from dualtrain.core.weights import load_weights
from dualtrain.spec import load_spec
from tools.ps_spike_common import free_ports, load_replay, normaliser, print_report, server_factor


class ParameterServer:
    """The model and torch.optim.SGD; an update waits for every trainer's gradient."""

    def __init__(self, run_dir: Path, trainers: int, factor: float):
        spec = load_spec(run_dir / "spec.yaml")
        self.model = build_model(spec.model, seed=spec.seed).double()
        load_canonical(self.model, load_weights(run_dir / "weights_init.npz"))
        o = spec.optimizer
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=o.lr,
            momentum=o.momentum,
            nesterov=o.nesterov,
            weight_decay=o.weight_decay,
        )
        self.trainers = trainers
        self.factor = factor
        self.lock = threading.Lock()
        self.pending: dict[int, list[torch.Tensor]] = {}
        self.future: torch.futures.Future = torch.futures.Future()

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def update(self, replica: int, grads: list[torch.Tensor], lr: float) -> torch.futures.Future:
        with self.lock:
            self.pending[replica] = grads
            fut = self.future
            if len(self.pending) == self.trainers:
                total = [g.clone() for g in self.pending[0]]
                for r in range(1, self.trainers):  # replica order, whatever order they arrived in
                    for t, g in zip(total, self.pending[r], strict=True):
                        t.add_(g)
                if self.factor != 1.0:
                    total = [t * self.factor for t in total]
                for p, g in zip(self.model.parameters(), total, strict=True):
                    p.grad = g
                for group in self.opt.param_groups:
                    group["lr"] = lr
                self.opt.step()
                self.pending = {}
                self.future = torch.futures.Future()
                fut.set_result(self.weights())
        return fut


_PS: ParameterServer | None = None  # in the parameter server's process


def ps_weights() -> list[torch.Tensor]:
    assert _PS is not None
    return _PS.weights()


@rpc.functions.async_execution
def ps_update(replica: int, grads: list[torch.Tensor], lr: float) -> torch.futures.Future:
    assert _PS is not None
    return _PS.update(replica, grads, lr)


def _process(rank: int, size: int, port: int, run_dir: str, out: str, plant: str | None) -> None:
    global _PS
    torch.set_num_threads(1)
    if rank == 0:
        _PS = ParameterServer(Path(run_dir), size - 1, server_factor(size - 1, plant))
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120
    )
    rpc.init_rpc(
        "ps" if rank == 0 else f"trainer{rank - 1}",
        rank=rank,
        world_size=size,
        rpc_backend_options=options,
    )
    if rank != 0:
        spec, data, steps, lrs = load_replay(Path(run_dir))
        replica = rank - 1
        model = build_model(spec.model, seed=spec.seed).double()
        weights = rpc.rpc_sync("ps", ps_weights)
        t0 = time.perf_counter()
        for ids_per_replica, lr in zip(steps, lrs, strict=True):
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights, strict=True):
                    p.copy_(w)
            model.zero_grad(set_to_none=True)
            ids = ids_per_replica[replica]
            n = normaliser(ids_per_replica, replica, plant)
            x = torch.from_numpy(data.inputs("train", ids)[0]).double()
            y = torch.from_numpy(data.targets("train", ids))
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            grads = [p.grad for p in model.parameters()]
            weights = rpc.rpc_sync("ps", ps_update, args=(replica, grads, lr))
        if replica == 0:
            Path(out).write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    rpc.shutdown()
    if rank == 0:
        assert _PS is not None
        np.savez(out + ".npz", **export_canonical(_PS.model))


def run(run_dir: Path, plant: str | None = None) -> None:
    spec = load_spec(run_dir / "spec.yaml")
    world = spec.distribution.world_size
    n_steps = sum(
        1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "ps")
        mp.spawn(
            _process,
            args=(world + 1, free_ports(1)[0], str(run_dir), out, plant),
            nprocs=world + 1,
        )
        seconds = json.loads(Path(out).read_text())["seconds"]
        final = dict(np.load(out + ".npz"))
    print_report("torch", run_dir, final, seconds, n_steps)
