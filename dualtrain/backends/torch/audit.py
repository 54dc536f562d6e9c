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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dualtrain.audit import record
from dualtrain.audit.identity import hexes, input_key
from dualtrain.backends.torch.audit_digests import Digests
from dualtrain.backends.torch.audit_epochs import Epochs
from dualtrain.backends.torch.audit_setup import (
    canonical_weights,
    check_setup,
    final_config,
    first_step_config,
    inner_optimizer,
    loader_len,
    loader_part,
    param_digests,
    prepare,
    read_config,
    same_world,
    world_of,
)
from dualtrain.backends.torch.audit_watch import Watchers
from dualtrain.backends.torch.envinfo import backend_facts
from dualtrain.errors import UserError, shown


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
        self.rank, self.world, self.dir = 0, 1, Path(run_dir)
        prepared = False
        try:
            optimizer = inner_optimizer(optimizer)
            sampler = sampler if sampler is not None else loader_part(loader, "sampler")
            check_setup(model, optimizer, sampler)
            self.rank, self.world = world_of()
            prepared = prepare(self.dir, self.rank, self.world, model)
            self.model, self.optimizer, self.scaler = model, optimizer, scaler
            self.sampler, self.sched = sampler, scheduler
            self.batches = loader_len(loader)
            self.batch_size = loader_part(loader, "batch_size")
            self.config = read_config(model, optimizer, scaler, loader, sampler, scheduler)
            self.init: dict[str, Any] | None = None  # read at the first rec.batch
            self.start: dict[str, str] | None = None  # every rank's digests of it
        except BaseException:
            if prepared and self.rank == 0:
                record.abandon(self.dir)  # nothing half-written: the folder says it failed
            record.release()
            raise
        self.steps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.calls = 0
        # the watchers (loops over the loader count an IterableDataset's epochs)
        self.watch = Watchers(model, loader, scheduler, lambda: len(self.steps))
        self.epochs = Epochs(sampler, self.batches, self.batch_size, self.watch.loops)
        self.stepped = self.deferred = False
        self.norm: torch.Tensor | None = None
        self.digests = Digests()
        self.started = time.perf_counter()
        self.closed = self.failed = False
        self.hooks = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]

    # ---- a failure of the recorder's own: said, the recording dropped, the loop goes on ----------
    def fail(self, where: str, error: BaseException) -> None:
        """A failure of the recorder's own at ``where`` (record.guarded): said once on stderr,
        the folder marked failed (compare refuses it), the recorder inert from here on."""
        record.say_stopped(where, error)
        self.failed = True
        self._unhook()
        if self.rank == 0:
            record.abandon(self.dir)
        else:
            record.part_failed(self.dir, self.rank)

    # ---- hooks -----------------------------------------------------------------------------------
    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        record.guarded(self, "the optimizer step", self._before_step, optimizer, args, kwargs)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.steps or self.stepped:
            raise UserError(
                f"the optimizer stepped {'twice in one' if self.steps else 'before any'} "
                f"recorded step: call rec.batch(inputs) at each optimizer step's start (once per "
                f"micro-batch) and rec.step(loss) after it. Received: optimizer.step() "
                f"{'again ' if self.steps else ''}at step {max(len(self.steps), 1)}"
            )
        # the lr the step uses (a script may set it after rec.batch)
        _set_lrs(self.steps[-1], self.optimizer)
        if len(self.steps) == 1 and getattr(self.sched, "_step_count", 1) > 1:  # torch's count
            self.config["scheduler"]["before_optimizer"] = True  # (1 once made): stepped early
        closure = kwargs.get("closure", args[0] if args else None)
        self.deferred = closure is not None  # a closure computes this step's gradient (Lightning,
        if not self.deferred:  # LBFGS): measured after the step, once the closure has run
            self.norm = _grad_norm(optimizer)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        record.guarded(self, "the optimizer step", self._after_step, optimizer)

    def _after_step(self, optimizer: Any) -> None:
        if self.deferred:
            self.norm = _grad_norm(optimizer)
        self.stepped = True

    # ---- the user's calls ------------------------------------------------------------------------
    def _close_step(self) -> None:
        if self.steps:
            last = self.steps[-1]
            last["skipped"] = not self.stepped
            last["grad_norm"] = self.norm if self.stepped else float("nan")
            self.rows[-1]["grad_norm"] = last["grad_norm"]  # this replica's (they all differ
            # where the gradients were not averaged: a forward through DDP's .module)
        self.stepped, self.norm = False, None

    def batch(self, inputs: Any, indices: Any = None, epoch: int | None = None) -> None:
        """The rows this replica feeds in the current optimizer step (a tensor, or a tuple or
        dict whose first tensor is the input); called again before ``rec.step``, it adds a
        micro-batch to the same step. ``indices``: the dataset indices, when the script knows
        them (else the sampler's, when the recorder was given its loader or sampler); ``epoch``:
        the script's epoch (else counted from the loader's length)."""
        self._open()
        record.guarded(self, "rec.batch", self._batch, inputs, indices, epoch)

    def _batch(self, inputs: Any, indices: Any, epoch: int | None) -> None:
        _not_validation(self.model)
        if self.calls == 0:  # the weights the first step starts from (a checkpoint loaded
            same_world(self.world)  # after the recorder was made included)
            weights = canonical_weights(self.model) if self.rank == 0 or self.world > 1 else {}
            self.init = weights if self.rank == 0 else {}
            self.start = param_digests(self.model, weights) if self.world > 1 else None
            first_step_config(self.config, self.model, self.optimizer)
        inputs = _input_rows(inputs)
        self.calls += 1
        n = int(inputs.shape[0])
        if self.current is None:  # a new optimizer step
            self._close_step()
            now = self.epochs.of(epoch, not self.steps and self.rank == 0)
            step = len(self.steps) + 1
            self.current = {
                "step": step,
                "epoch": now,
                "replica": self.rank,
                "count": 0,
                "batches": 0,
                "loss": None,
                "exact": [],
                "pattern": [],
                "indices": [],
            }
            self.rows.append(self.current)
            entry = {"step": step, "epoch": now, "lr": None, "loss_scale": _scale_of(self.scaler)}
            _set_lrs(entry, self.optimizer)  # read again when the optimizer steps
            entry["eval"] = not self.model.training  # model.train() not called again after eval
            self.steps.append(entry)
        elif self.stepped:
            raise UserError(
                f"rec.step(loss) is missing: the optimizer stepped since this step's rec.batch "
                f"(call rec.step(loss) after each optimizer step). Received: rec.batch at step "
                f"{len(self.steps)} after its optimizer step"
            )
        else:
            self.epochs.of(epoch, False)
        idx = [int(i) for i in indices] if indices is not None else self.epochs.indices(n)
        self.epochs.pos += 1
        row = self.current
        row["count"] += n
        row["batches"] += 1
        self.digests.add(row, inputs)
        row["indices"] = None if idx is None or row["indices"] is None else row["indices"] + idx

    def step(self, loss: Any) -> None:
        """This replica's loss of the step (its mean over its rows, as the script computed it);
        once per optimizer step, after ``rec.batch``."""
        self._open()
        if self.current is None and not self.failed:
            raise UserError("rec.step(loss) needs rec.batch(inputs) first, once per optimizer step")
        record.guarded(self, "rec.step", self._step, loss)

    def _step(self, loss: Any) -> None:
        assert self.current is not None
        self.current["loss"] = _loss_value(loss)
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
            record.guarded(self, "rec.close", self._write)
            if self.failed and self.world > 1:  # the barrier the other processes' close waits at
                dist.barrier()
        finally:
            record.release()

    def _write(self) -> None:
        try:
            self._close_step()
            self._unhook()
            self.epochs.summary(self.config)
            final_config(self.config, self.optimizer)
            self.config["eval_steps"] = [s["step"] for s in self.steps if s.pop("eval", False)]
            self.watch.summary(self.config, len(self.steps))
            self.digests.flush()
            rows = [_plain_row(r) for r in self.rows]
            final = canonical_weights(self.model) if self.rank == 0 or self.world > 1 else {}
            digests = None  # every rank's parameters, as the first step and the end saw them
            if self.start is not None:
                digests = {"init": self.start, "final": param_digests(self.model, final)}
            record.write_part(self.dir, self.rank, rows, digests)
            if self.rank == 0:
                record.finish(
                    self.dir,
                    framework="torch",
                    world_size=self.world,
                    steps=[_plain(s) for s in self.steps],
                    ranks=self.world,
                    config=self.config,
                    weights_init=self.init if self.init is not None else final,
                    weights_final=final,
                    env={"torch": backend_facts(gpu_details=False)},
                    wall_s=time.perf_counter() - self.started,
                )
            if self.world > 1:
                dist.barrier()
        except BaseException:
            if self.rank == 0:
                record.abandon(self.dir)  # nothing half-written: the folder says it failed
            raise

    def _unhook(self) -> None:
        for h in self.hooks:
            h.remove()
        self.watch.close()

    def __enter__(self) -> TorchRecorder:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        self.closed = True
        self._unhook()
        if self.rank == 0:
            record.abandon(self.dir)
        record.release()


def _grad_norm(optimizer: Any) -> torch.Tensor | None:
    """The norm of the gradient the optimizer steps with (over every group's parameters)."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    if grads[0].dtype in (torch.float16, torch.bfloat16):  # a half-precision model's: its
        # norm summed in float32 (in bfloat16 it is off by ~0.5%), no float32 copies
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms))
    # foreach norms: a few kernels, whatever the number of parameters
    return torch.nn.utils.get_total_norm(grads, foreach=grads[0].device.type != "cpu")


def _not_validation(model: Any) -> None:
    """rec.batch under torch.no_grad() with the model in eval mode: a validation batch, whose
    rows would be counted in the next optimizer step (and its epoch's steps)."""
    if not torch.is_grad_enabled() and not model.training:
        raise UserError(
            "rec.batch records the rows of a training step: call it only for the batches the "
            "optimizer steps on, not for validation. Received: rec.batch under torch.no_grad() "
            "with the model in eval mode"
        )


def _set_lrs(entry: dict[str, Any], optimizer: Any) -> None:
    """The step's lr (every group's, under ``lrs``, where there are several)."""
    lrs = [float(g["lr"]) for g in optimizer.param_groups]
    entry["lr"] = lrs[0]
    if len(lrs) > 1:
        entry["lrs"] = lrs


def _scale_of(scaler: Any) -> Any:
    """The loss scale a step starts with (GradScaler's tensor: no host sync)."""
    if scaler is None or not scaler.is_enabled():
        return None
    live = getattr(scaler, "_scale", None)
    return live.detach().clone() if isinstance(live, torch.Tensor) else scaler.get_scale()


def _input_rows(inputs: Any) -> torch.Tensor:
    """The tensor whose rows rec.batch digests: the tensor itself, a tuple's or list's first
    tensor (``(data, target)``), a mapping's input (dualtrain.audit.identity.input_key: the same
    key the Keras recorder picks; ``labels`` and masks are never it)."""
    if isinstance(inputs, Mapping):
        key = input_key(inputs.keys())
        inputs = inputs[key] if key is not None else None
    if isinstance(inputs, (list, tuple)):
        inputs = next((x for x in inputs if isinstance(x, torch.Tensor)), inputs)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
        raise UserError(
            f"rec.batch takes the step's input tensor (rows first), or a tuple or dict holding "
            f"it. Received: {shown(inputs)}"
        )
    return inputs


def _loss_value(loss: Any) -> Any:
    """rec.step's loss: a number or a one-element tensor (kept on its device: no sync)."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    raise UserError(
        f"rec.step takes the step's loss, a number or a one-element tensor (this replica's "
        f"mean over its rows). Received: {shown(loss)}"
    )


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in row.items()}


def _plain_row(row: dict[str, Any]) -> dict[str, Any]:
    out = _plain({k: v for k, v in row.items() if k not in ("exact", "pattern")})
    out["exact"] = hexes(torch.cat(row["exact"]).cpu().numpy())
    out["pattern"] = hexes(torch.cat(row["pattern"]).cpu().numpy())
    return out
