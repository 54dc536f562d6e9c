"""The loop's evaluations: the test split, and the validation split where there is one, scored by
every replica's slice (train.ema.evaluate: on the averaged weights); one eval record; and early
stopping's decision on it (dualtrain.core.stopping: the chief decides, every process learns it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import TEST, VALIDATION
from dualtrain.core.losses import metric_name
from dualtrain.core.plan import eval_shards
from dualtrain.core.stopping import Stopper
from dualtrain.core.weights import save_weights
from dualtrain.records.record import TEST_CORRECT, WEIGHTS_BEST
from dualtrain.runtime.context import RunContext


def shown(metric: str, value: float | None) -> str:
    """A metric as the progress lines print it (accuracy in percent)."""
    if value is None:
        return "n/a"
    return f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.4g}"


class Evaluator:
    def __init__(self, ctx: RunContext):
        spec, data = ctx.spec, ctx.data
        self.engine = ctx.engine
        self.data = data
        self.writer = ctx.writer
        self.run_dir = ctx.run_dir
        self.out = ctx.out
        self.counters = ctx.counters
        self.ema = spec.train.ema
        self.keep_best = spec.train.keep_best
        self.metric = metric_name(spec.model.loss)
        world = spec.distribution.world_size
        self.ranges = {
            split: eval_shards(data.size(split), world)
            for split in (TEST, VALIDATION)
            if data.size(split)
        }
        stop_spec = spec.train.early_stopping
        self.stopper = Stopper.from_spec(stop_spec) if stop_spec is not None else None
        self.stop = False
        """Early stopping ends the run after this evaluation."""

    def evaluate(self, step: int, epoch: int) -> None:
        """One eval record (the validation's fields prefixed val_), the counters' last_eval."""
        row: dict[str, Any] = {"step": step, "epoch": epoch}
        said = []
        t_eval = time.perf_counter()
        with self._averaged():  # train.ema.evaluate: once for both splits
            for split, prefix in ((TEST, ""), (VALIDATION, "val_")):
                if split not in self.ranges:
                    continue
                local = [self.ranges[split][r] for r in self.engine.local_replicas]
                with self.out.busy(f"evaluating on {self.data.size(split):,} {split} samples"):
                    ev = self.engine.evaluate(split, local)
                if split == TEST and ev.correct is not None:
                    self._keep_correct(local, ev.correct)
                value = ev.metric_sum / ev.count
                row |= {
                    f"{prefix}loss": ev.loss_sum / ev.count,
                    f"{prefix}{self.metric}": value,
                    f"{prefix}count": int(ev.count),
                }
                said.append(
                    f"{split} loss {ev.loss_sum / ev.count:.4f} {self.metric} "
                    f"{shown(self.metric, value)} ({int(ev.count)} samples)"
                )
        self.counters.eval_time += time.perf_counter() - t_eval
        self.counters.last_eval = row
        if self.stopper is not None:
            row |= self._early_stopping(row, step)
        if self.writer is not None:
            self.writer.eval(**row)
        self.out.line(f"eval after step {step}: " + "; ".join(said))
        if self.stop:
            s = self.stopper
            assert s is not None  # only early stopping stops
            self.out.line(
                f"early stopping after step {step}: {s.metric} has not improved by more than "
                f"{s.min_delta:g} for {s.wait} evaluation(s); best {s.best:.6g} after step "
                f"{s.best_step}" + (" (weights_best.npz)" if self.keep_best else "")
            )

    def _keep_correct(self, local: list[tuple[int, int]], correct: np.ndarray) -> None:
        """The test split's per-sample correctness, every process's ranges in place (a gather
        every process joins), written by the chief as TEST_CORRECT: the latest evaluation's."""
        mine = np.full(self.data.size(TEST), -1, dtype=np.int64)
        at = 0
        for start, stop in local:
            mine[start:stop] = correct[at : at + stop - start]
            at += stop - start
        whole = self.engine.gather(mine).max(axis=0)  # each sample is one process's
        if self.writer is not None and self.run_dir is not None and (whole >= 0).all():
            path = Path(self.run_dir) / TEST_CORRECT
            tmp = path.with_name(path.name + ".tmp.npy")
            np.save(tmp, whole.astype(np.uint8))
            tmp.replace(path)  # atomically: a stopped run leaves the previous evaluation's

    def _early_stopping(self, row: dict[str, Any], step: int) -> dict[str, Any]:
        """The chief's decision on this evaluation, shared with every process (a gather every
        process joins, so none is left waiting in a collective); the best weights when kept."""
        s = self.stopper
        assert s is not None
        improved, stop = s.update(float(row[s.metric]), step)
        shared = self.engine.gather(np.array([int(improved), int(stop)], dtype=np.int64))
        improved, stop = bool(shared[0][0]), bool(shared[0][1])
        if stop:
            s.stopped_at = step
        self.stop = stop
        if improved and self.keep_best:
            weights = self.engine.weights()  # every process: an engine may gather for it
            if self.writer is not None:
                assert self.run_dir is not None  # a writer implies a run directory
                save_weights(Path(self.run_dir) / WEIGHTS_BEST, weights)
        return {"best": improved, **({"stop": True} if stop else {})}

    @contextlib.contextmanager
    def _averaged(self) -> Iterator[None]:
        """With train.ema.evaluate: the averaged weights swapped in for an evaluation (both
        splits), the live ones back afterwards, bit for bit; otherwise nothing."""
        if self.ema is None or not self.ema.evaluate:
            yield
            return
        live = self.engine.weights()
        self.engine.load_weights(self.engine.ema_weights())
        try:
            yield
        finally:
            self.engine.load_weights(live)
