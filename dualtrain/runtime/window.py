"""The steps since the last flush, and what a flush does with them: every process's loss sums and
shard digests gathered, the chief's metrics.jsonl / shards.jsonl rows written, a progress line
printed; and the run's counters they add to (samples, skipped steps, training time), which a
checkpoint carries and the summary reports."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dualtrain.core.plan import micro_sizes, shard_digest
from dualtrain.runtime.context import RunContext
from dualtrain.runtime.engine import StepOut


@dataclass(frozen=True)
class Entry:
    """One step waiting for the next flush."""

    step: int
    epoch: int
    lr: float
    out: StepOut
    count: int
    """The step's global sample count (its loss normaliser)."""


class Window:
    """The steps since the last flush (:meth:`flush` empties it)."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        accumulate: int,
        total_steps: int,
        epochs: int,
        show_scale: bool,
    ):
        self.engine = ctx.engine
        self.writer = ctx.writer
        self.out = ctx.out
        self.counters = ctx.counters
        self.accumulate = accumulate
        self.total_steps = total_steps
        self.epochs = epochs
        self.show_scale = show_scale
        """Print the loss scale on each progress line (fp16)."""
        self.entries: list[Entry] = []
        self.t0 = 0.0
        """When the window's time began (samples/s counts training time only)."""

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def restart_clock(self, now: float) -> None:
        self.t0 = now

    def flush(self, keep: bool = False) -> None:
        """Gather the window's per-process loss sums and shard digests; the chief writes them.
        ``keep``: the progress line stays on screen under the live bar (an epoch's end)."""
        if not self.entries:
            return
        entries, n_local = self.entries, len(self.engine.local_replicas)
        losses = np.array([e.out.loss_sum for e in entries], dtype=np.float64)
        shard_rows = np.array(
            [
                [int(shard_digest(ids), 16) - (1 << 63), len(ids)]
                for e in entries
                for ids in e.out.fed_ids
            ],
            dtype=np.int64,
        )
        if shard_rows.shape[0] != len(entries) * n_local:
            raise RuntimeError("engine returned fed_ids for the wrong number of replicas")
        all_losses = self.engine.gather(losses)  # (processes, window)
        all_shards = self.engine.gather(shard_rows.reshape(len(entries), n_local, 2))
        now = time.perf_counter()
        elapsed = now - self.t0
        self.t0 = now
        sps = sum(e.count for e in entries) / elapsed if elapsed > 0 else 0.0
        if self.writer is not None:
            self._write(all_losses, all_shards, sps)
        for e in entries:
            self.counters.samples += e.count
            self.counters.skipped += int(e.out.skipped)
        last = entries[-1]
        loss = float(all_losses[:, -1].sum()) / last.count
        scale = f" scale {last.out.loss_scale:g}" if self.show_scale else ""
        self.out.advance(last.step, last.epoch, loss=loss, rate=sps)
        text = (
            f"epoch {last.epoch}/{self.epochs} step {last.step}/{self.total_steps} "
            f"loss {loss:.4f} lr {last.lr:.4g}{scale} {sps:,.0f} samples/s"
        )
        if keep:
            self.out.line(text)
        else:
            self.out.logged(text)
        self.entries = []

    def _write(self, all_losses: np.ndarray, all_shards: np.ndarray, sps: float) -> None:
        """The chief's metrics.jsonl and shards.jsonl rows of the window."""
        writer = self.writer
        assert writer is not None
        per = len(self.engine.local_replicas)
        replicas = [
            r for proc in range(all_shards.shape[0]) for r in range(proc * per, (proc + 1) * per)
        ]
        for i, e in enumerate(self.entries):
            out = e.out
            writer.train(
                step=e.step,
                epoch=e.epoch,
                loss=float(all_losses[:, i].sum()) / e.count,
                lr=e.lr,
                grad_norm=out.grad_norm,
                loss_scale=out.loss_scale,
                skipped=bool(out.skipped),
                samples=e.count,
                samples_per_s=sps,
                **({} if out.grad_amax is None else {"grad_amax": out.grad_amax}),
            )
            rows = all_shards[:, i].reshape(-1, 2)
            for replica, (digest, n) in sorted(zip(replicas, rows.tolist(), strict=True)):
                writer.shard(
                    step=e.step,
                    epoch=e.epoch,
                    replica=replica,
                    digest=f"{(digest + (1 << 63)):016x}",
                    count=n,
                    micro=micro_sizes(n, self.accumulate) if self.accumulate > 1 else None,
                )
