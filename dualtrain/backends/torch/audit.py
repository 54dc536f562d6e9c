"""The audit recorder for a hand-written PyTorch loop (DDP or one process): a few lines in the
user's own script record each optimizer step (dualtrain.audit.record says the files)::

    with dualtrain.audit.torch_recorder("runs/audit_torch", model=model, optimizer=opt,
                                        scaler=scaler, loader=train_loader) as rec:
        for epoch in ...:
            for data, target in train_loader:
                rec.batch(data)          # the rows this replica feeds (its sampler's indices too)
                ...forward, backward, optimizer (or scaler) step...
                rec.step(loss)           # this replica's loss of the step

Per step: the lr and loss scale at the step's start, the gradient norm the optimizer sees (a
pre-step hook: after DDP's all-reduce and GradScaler's unscale), whether the optimizer stepped (a
post-step hook that did not fire: GradScaler skipped it), the replica's loss and rows. Values stay
tensors until ``close()`` (no host sync per step); each process writes its own part and the chief
merges them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.audit import record
from dualtrain.audit.identity import CHUNK, MASK32, hexes, multipliers
from dualtrain.backends.torch.envinfo import backend_facts
from dualtrain.errors import UserError, shown

_SCALAR = (int, float, bool, str, type(None))


def _options(obj: Any) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in vars(obj).items()
        if not k.startswith("_") and (isinstance(v, _SCALAR) or isinstance(v, tuple))
    }


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _check_setup(model: Any, optimizer: Any, sampler: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise UserError(
            f"torch_recorder's model must be a torch.nn.Module. Received: {shown(model)}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(
            f"torch_recorder's optimizer must be a torch.optim.Optimizer. Received: "
            f"{shown(optimizer)}"
        )
    rank, world = _world()
    if isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.num_replicas != world:
        group = "no process group is initialised" if world == 1 else f"the group has {world}"
        raise UserError(
            f"the DistributedSampler splits the data over {sampler.num_replicas} replicas but "
            f"{group} (call torch.distributed.init_process_group before the recorder). Received: "
            f"num_replicas={sampler.num_replicas}"
        )


def canonical_weights(model: Any) -> dict[str, np.ndarray]:
    """The state dict (DDP's ``module.`` unwrapped) as float32/64 NumPy, without counters."""
    inner = model.module if hasattr(model, "module") else model
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's wrapper
    return {
        k: v.detach().cpu().numpy().copy()
        for k, v in inner.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }


def _config(
    model: Any, optimizer: Any, scaler: Any, loader: Any, sampler: Any, sched: Any
) -> dict[str, Any]:
    inner = model.module if hasattr(model, "module") else model
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    cfg: dict[str, Any] = {
        "optimizer": {"type": type(optimizer).__name__, **record_safe(group)},
        "batchnorm": [
            {"name": n, "momentum": m.momentum, "eps": m.eps, "convention": "torch"}
            for n, m in inner.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        ],
        "ddp": type(model).__name__ == "DistributedDataParallel",
    }
    if scaler is not None and scaler.is_enabled():
        state = scaler.state_dict()
        cfg["loss_scale"] = {
            "type": "GradScaler",
            "initial_scale": float(state["scale"]),
            "growth_interval": int(state["growth_interval"]),
            "growth_factor": float(state["growth_factor"]),
            "backoff_factor": float(state["backoff_factor"]),
        }
    if sched is not None:
        cfg["scheduler"] = {"type": type(sched).__name__, **_options(sched)}
    if loader is not None:
        cfg["loader"] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
        cfg["loader"]["batches"] = len(loader)
    if sampler is not None:
        cfg["sampler"] = {"type": type(sampler).__name__, **_options(sampler)}
        cfg["sampler"]["dataset_size"] = (
            len(sampler.dataset) if hasattr(sampler, "dataset") else None
        )
    return cfg


def record_safe(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in d.items()
        if isinstance(v, _SCALAR) or isinstance(v, tuple)
    }


class Digests:
    """Each row's digests (dualtrain.audit.identity), computed for many steps at once: the
    inputs wait as float32 copies (one kernel per step) until ``STEPS`` steps or ``BYTES`` are
    pending, then a few float64 matrix products digest them all."""

    STEPS, BYTES = 32, 64 * 2**20

    def __init__(self) -> None:
        self.pending: list[tuple[dict[str, Any], torch.Tensor]] = []
        self.bytes = 0
        self.mult: dict[tuple[int, str], torch.Tensor] = {}

    def add(self, row: dict[str, Any], x: torch.Tensor) -> None:
        x = x.detach().reshape(x.shape[0], -1).to(torch.float32, copy=True)
        self.pending.append((row, x))
        self.bytes += x.numel() * 4
        if len(self.pending) >= self.STEPS or self.bytes >= self.BYTES:
            self.flush()

    def flush(self) -> None:
        groups: dict[tuple[int, str], list[tuple[dict[str, Any], torch.Tensor]]] = {}
        for row, x in self.pending:
            groups.setdefault((x.shape[1], str(x.device)), []).append((row, x))
        for key, items in groups.items():
            exact, pattern = self._compute(key, torch.cat([x for _, x in items]))
            sizes = [x.shape[0] for _, x in items]
            for (row, _), e, p in zip(items, exact.split(sizes), pattern.split(sizes), strict=True):
                row["exact"].append(e)
                row["pattern"].append(p)
        self.pending, self.bytes = [], 0

    def _compute(self, key: tuple[int, str], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.mult:
            self.mult[key] = torch.from_numpy(multipliers(key[0])).to(x.device)
        mult = self.mult[key]
        bits = x.view(torch.int32).long() & MASK32
        words = torch.cat([bits & 0xFFFF, bits >> 16], dim=1).double()
        mask = (x > x.min(1, keepdim=True).values).double()
        return _dot(words, mult), _dot(mask, mult[: key[0]])


def _dot(words: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(words.shape[0], 2, dtype=torch.int64, device=words.device)
    for lo in range(0, words.shape[1], CHUNK):
        out += (words[:, lo : lo + CHUNK] @ mult[lo : lo + CHUNK]).long()
    return out & MASK32


class TorchRecorder:
    """See the module docstring; made by dualtrain.audit.torch_recorder."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        model: Any,
        optimizer: Any,
        scaler: Any = None,
        loader: Any = None,
        sampler: Any = None,
        scheduler: Any = None,
    ):
        record.claim("torch")
        try:
            sampler = sampler if sampler is not None else getattr(loader, "sampler", None)
            _check_setup(model, optimizer, sampler)
            self.rank, self.world = _world()
            self.dir = Path(run_dir)
            if self.rank == 0:
                record.prepare(self.dir, "torch")
            if self.world > 1:
                dist.barrier()  # every rank sees a prepared folder
        except BaseException:
            record.release()
            raise
        self.model, self.optimizer, self.scaler, self.sampler = model, optimizer, scaler, sampler
        self.batches = len(loader) if loader is not None else None
        self.batch_size = getattr(loader, "batch_size", None)
        self.config = _config(model, optimizer, scaler, loader, sampler, scheduler)
        self.init = canonical_weights(model) if self.rank == 0 else {}
        self.steps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.order: list[int] | None = None
        self.current: dict[str, Any] | None = None
        self.epoch_now, self.pos, self.calls = 0, 0, 0
        self.stepped = False
        self.norm: torch.Tensor | None = None
        self.digests = Digests()
        self.started = time.perf_counter()
        self.closed = False
        self.hooks = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]

    # ---- hooks -----------------------------------------------------------------------------------
    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if grads:  # foreach norms: a few kernels, whatever the number of parameters
            self.norm = torch.nn.utils.get_total_norm(grads, foreach=grads[0].device.type != "cpu")

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped = True

    # ---- the user's calls ------------------------------------------------------------------------
    def _sampler_indices(self, n: int) -> list[int] | None:
        deterministic = (torch.utils.data.DistributedSampler, torch.utils.data.SequentialSampler)
        if not isinstance(self.sampler, deterministic) or not self.batch_size:
            return None  # iterating another sampler could draw from the script's RNG
        if self.pos == 0 or self.order is None:
            self.order = [int(i) for i in iter(self.sampler)]
        start = self.pos * self.batch_size
        got = self.order[start : start + n]
        return got if len(got) == n else None

    def _epoch(self, epoch: int | None) -> int:
        """The epoch of this batch (the script's, else counted from the loader's length)."""
        if epoch is None:
            epoch = (self.calls - 1) // self.batches + 1 if self.batches else 1
        if epoch != self.epoch_now:
            self.epoch_now, self.pos, self.order = epoch, 0, None
        return epoch

    def _close_step(self) -> None:
        if self.steps:
            last = self.steps[-1]
            last["skipped"] = not self.stepped
            last["grad_norm"] = self.norm if self.stepped else float("nan")
        self.stepped, self.norm = False, None

    def _scale(self) -> Any:
        """The loss scale this step starts with (GradScaler's tensor: no host sync)."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        live = getattr(self.scaler, "_scale", None)
        return live.detach().clone() if isinstance(live, torch.Tensor) else self.scaler.get_scale()

    def batch(self, inputs: Any, indices: Any = None, epoch: int | None = None) -> None:
        """The rows this replica feeds in the current optimizer step (a tensor, or a tuple or
        dict whose first tensor is the input); called again before ``rec.step``, it adds a
        micro-batch to the same step. ``indices``: the dataset indices, when the script knows
        them (else the sampler's, when the recorder was given its loader or sampler); ``epoch``:
        the script's epoch (else counted from the loader's length)."""
        self._open()
        if isinstance(inputs, dict):
            inputs = next(iter(inputs.values()))
        if isinstance(inputs, (list, tuple)):
            inputs = inputs[0]
        if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
            raise UserError(
                f"rec.batch takes the step's input tensor (rows first). Received: {shown(inputs)}"
            )
        self.calls += 1
        n = int(inputs.shape[0])
        if self.current is None:  # a new optimizer step
            self._close_step()
            now = self._epoch(epoch)
            step = len(self.steps) + 1
            self.current = {
                "step": step,
                "epoch": now,
                "replica": self.rank,
                "count": 0,
                "loss": None,
                "exact": [],
                "pattern": [],
                "indices": [],
            }
            self.rows.append(self.current)
            lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
            entry = {"step": step, "epoch": now, "lr": lrs[0], "loss_scale": self._scale()}
            self.steps.append(entry | ({"lrs": lrs} if len(lrs) > 1 else {}))
        else:
            self._epoch(epoch)
        idx = [int(i) for i in indices] if indices is not None else self._sampler_indices(n)
        self.pos += 1
        row = self.current
        row["count"] += n
        self.digests.add(row, inputs)
        row["indices"] = None if idx is None or row["indices"] is None else row["indices"] + idx

    def step(self, loss: Any) -> None:
        """This replica's loss of the step (its mean over its rows, as the script computed it);
        once per optimizer step, after ``rec.batch``."""
        self._open()
        if self.current is None:
            raise UserError("rec.step(loss) needs rec.batch(inputs) first, once per optimizer step")
        self.current["loss"] = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
        self.current = None

    def _open(self) -> None:
        if self.closed:
            raise UserError("this audit recorder is closed; start a new one for another run")

    def close(self) -> None:
        """Write the record (every process calls it; the chief writes the run directory)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close_step()
            for h in self.hooks:
                h.remove()
            self.digests.flush()
            rows = [_plain_row(r) for r in self.rows]
            record.write_part(self.dir, self.rank, rows)
            if self.rank == 0:
                record.finish(
                    self.dir,
                    framework="torch",
                    world_size=self.world,
                    steps=[_plain(s) for s in self.steps],
                    ranks=self.world,
                    config=self.config,
                    weights_init=self.init,
                    weights_final=canonical_weights(self.model),
                    env={"torch": backend_facts(gpu_details=False)},
                    wall_s=time.perf_counter() - self.started,
                )
            if self.world > 1:
                dist.barrier()
        finally:
            record.release()

    def __enter__(self) -> TorchRecorder:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        self.closed = True
        for h in self.hooks:
            h.remove()
        if self.rank == 0:
            record.abandon(self.dir)
        record.release()


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in row.items()}


def _plain_row(row: dict[str, Any]) -> dict[str, Any]:
    out = _plain({k: v for k, v in row.items() if k not in ("exact", "pattern")})
    out["exact"] = hexes(torch.cat(row["exact"]).cpu().numpy())
    out["pattern"] = hexes(torch.cat(row["pattern"]).cpu().numpy())
    return out
