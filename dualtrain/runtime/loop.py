"""The training loop policy shared by both backends (framework-free).

A backend supplies an :class:`Engine` (the mechanics: a train step, distributed evaluation, a
gather, the weights). :class:`TrainLoop` owns everything else, once for both: which ids each replica
gets (the plan), the lr at every step (dualtrain.core.schedule), the loss normaliser (the global
sample count of the step), eval cadence, fault injection, progress output, and the run-directory
records. So the two backends cannot disagree on policy, only on numerics.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core import ema as ema_rule
from dualtrain.core.data import TEST, TRAIN, VALIDATION, Data
from dualtrain.core.losses import metric_name
from dualtrain.core.plan import ShardPlan, eval_shards, micro_sizes, shard_digest
from dualtrain.core.schedule import lr_at
from dualtrain.core.stopping import Stopper
from dualtrain.core.weights import save_weights, weights_digest
from dualtrain.errors import UserError
from dualtrain.records.record import WEIGHTS_BEST, WEIGHTS_EMA, WEIGHTS_FINAL, RunWriter
from dualtrain.runtime import clock, probes
from dualtrain.runtime.checkpoint import EMA_SLOT, Checkpoint
from dualtrain.runtime.engine import Engine, StepOut
from dualtrain.runtime.probing import CheckpointSteps, ProbeSteps
from dualtrain.runtime.progress import Reporter
from dualtrain.runtime.start import steps_total
from dualtrain.spec import Every, Experiment


class TrainLoop(ProbeSteps, CheckpointSteps):
    def __init__(
        self,
        spec: Experiment,
        engine: Engine,
        data: Data,
        run_dir: Path | None,
        *,
        extra_summary: dict[str, Any] | None = None,
        started: float | None = None,
        resume: Checkpoint | None = None,
        attempt: int = 0,
        model_sha256: str = "",
    ):
        self.spec = spec
        self.model_sha256 = model_sha256  # a model pair's (dualtrain.core.pair); "" otherwise
        self.engine = engine
        self.data = data
        self.plan = ShardPlan.from_spec(spec, data.size(TRAIN))
        self.total_steps = steps_total(spec, self.plan)
        self.chief = engine.rank == 0
        # A resumed run appends to records the launcher cut back to the checkpoint's step.
        self.writer = (
            RunWriter(run_dir, append=resume is not None, tensorboard=spec.logging.tensorboard)
            if self.chief and run_dir is not None
            else None
        )
        self.resume = resume
        self.start_step = resume.step if resume is not None else 0
        self.step = self.start_step
        """The last step begun (error messages say where a run stopped)."""
        self.attempt = attempt
        self.run_dir = run_dir
        self.extra_summary = extra_summary or {}
        self.started = started or time.perf_counter()
        self.world = spec.distribution.world_size
        self.eval_ranges = {
            split: eval_shards(data.size(split), self.world)
            for split in (TEST, VALIDATION)
            if data.size(split)
        }
        self.metric = metric_name(spec.model.loss)
        self._window: list[tuple[int, int, float, StepOut, int]] = []
        self._window_t0 = 0.0
        self.train_time = 0.0
        self.eval_time = 0.0
        self.samples = 0
        self.skipped = 0
        self.last_eval: dict[str, Any] = {}
        self._poison = {tuple(p) for p in spec.debug.nonfinite_grad}
        self._dump = set(spec.debug.dump_grads)
        self.history: list[dict[str, Any]] = []
        # train.early_stopping / keep_best (dualtrain.core.stopping): the chief decides
        stop_spec = spec.train.early_stopping
        self.stopper = Stopper.from_spec(stop_spec) if stop_spec is not None else None
        self.stop = False
        self.checkpoints, self.checkpoint_s = 0, 0.0
        self.out = Reporter(
            f"[{engine.backend}]", spec.logging.progress, self.total_steps, enabled=self.chief
        )
        # Teacher-forced one-step probes (dualtrain.runtime.probes): compare asks the fp64 reference
        # run to record states, and the requested-precision runs to replay them after training.
        self.probe_role = probes.role_from_env()
        self._probe_index: list[dict[str, Any]] = []
        self._record_at: set[int] = set()
        if self.probe_role is not None and self.probe_role.mode == "record":
            self._record_at = set(probes.probe_steps(self.total_steps))
        elif self.probe_role is not None:
            assert self.probe_role.source is not None  # a replay role names its source run
            self._probe_index = probes.read_index(self.probe_role.source) or []
        # replay: the loss scale this run used at each probe step (and its last one, for steps a
        # resumed run did not take itself)
        self._scale_at = {int(r["step"]) for r in self._probe_index}
        self._scales: dict[int, float] = {}
        self._last_scale = 1.0
        if resume is not None:  # the counters continue where the checkpoint left them
            loop = resume.state["loop"]
            self.samples, self.skipped = int(loop["samples"]), int(loop["skipped"])
            self.train_time = float(loop["train_time"])
            self.last_eval = dict(loop["last_eval"])
            if self.stopper is not None and "stopping" in loop:
                self.stopper.load(loop["stopping"])
            self.history = [
                *resume.state.get("history", []),
                {
                    "from_step": resume.step,
                    "checkpoint": str(resume.path),
                    "backend": engine.backend,
                    "world_size": self.world,
                    "checkpoint_backend": resume.state["backend"],
                    "checkpoint_world_size": resume.state["world_size"],
                },
            ]

    # ---- output ----------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.out.line(text)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self.out.finish()  # a failed run leaves no half-drawn bar before its error

    def _run(self) -> dict[str, Any]:
        spec, plan = self.spec, self.plan
        epochs = spec.train.epochs or -(-self.total_steps // plan.steps_per_epoch)
        self.say(
            f"{spec.name}: {spec.model.preset or 'custom'} model, world_size {self.world}, "
            f"{spec.precision.dtype.value}, {self.data.size(TRAIN)} train samples, "
            f"{plan.steps_per_epoch} steps/epoch, {self.total_steps} steps"
        )
        step = self.start_step
        starts = self.engine.gather(np.array([step], dtype=np.int64)).reshape(-1)
        if (starts != step).any():  # e.g. a restarted worker that cannot see the checkpoint folder
            raise UserError(
                f"the workers would start at different steps ({starts.tolist()} by "
                f"process): every worker must see the same run directory and checkpoint"
            )
        if step:
            assert self.resume is not None  # only a resumed run starts after step 0
            self.say(f"resuming after step {step} from {self.resume.path}")
        if spec.train.ema is not None:  # the average starts as the weights, or the checkpoint's
            held = self.resume.optimizer.slots if self.resume is not None else {}
            saved = {k[len(EMA_SLOT) :]: v for k, v in held.items() if k.startswith(EMA_SLOT)}
            if saved:
                self.engine.load_ema({**self.resume.weights, **saved})  # type: ignore[union-attr]
            else:
                self.engine.ema(ema_rule.COPY, spec.train.ema.decay)
        t_train = time.perf_counter()
        self._window_t0 = t_train
        self.out.start(step, epochs)
        every = spec.train.checkpoint_every
        for epoch in range(step // plan.steps_per_epoch, epochs):
            for k in range(step - epoch * plan.steps_per_epoch, plan.steps_per_epoch):
                if step >= self.total_steps:
                    break
                step += 1
                self.step = step
                self._maybe_exit(step)
                ids, count, lr = self._step_inputs(step)
                local = [ids[r] for r in self.engine.local_replicas]
                poison = [(step, r) in self._poison for r in self.engine.local_replicas]
                if step in self._record_at:
                    self._record_probe(step, local, count, lr)
                out = self.engine.train_step(
                    local,
                    lr=lr,
                    global_count=count,
                    poison=poison,
                    capture_grads=step in self._dump,
                    step=step,
                )
                if spec.train.ema is not None:
                    todo = ema_rule.action(spec.train.ema, step)
                    if todo is not None:
                        self.engine.ema(todo, spec.train.ema.decay)
                self._last_scale = out.loss_scale
                if step in self._scale_at:
                    self._scales[step] = out.loss_scale
                if out.grads is not None and self.writer is not None and step in self._dump:
                    assert self.run_dir is not None  # a writer implies a run directory
                    save_weights(Path(self.run_dir) / f"grads_step{step}.npz", out.grads)
                self._window.append((step, epoch + 1, lr, out, count))
                self.out.advance(step, epoch + 1)
                end_of_epoch = k == plan.steps_per_epoch - 1 or step == self.total_steps
                if step % spec.train.log_every == 0 or end_of_epoch:
                    self._flush(epochs, keep=end_of_epoch)
                eval_due = (spec.train.eval_every and step % spec.train.eval_every == 0) or (
                    not spec.train.eval_every and end_of_epoch
                )
                if eval_due or step == self.total_steps:
                    self.train_time += time.perf_counter() - t_train
                    self._evaluate(step, epoch + 1)
                    t_train = time.perf_counter()
                    self._window_t0 = t_train
                if every is not None and (
                    step == self.total_steps
                    or self.stop
                    or (end_of_epoch if every is Every.EPOCH else step % every == 0)
                ):
                    self._flush(epochs)  # the records are complete up to this step
                    self.train_time += time.perf_counter() - t_train
                    self._checkpoint(step, epoch + 1)
                    t_train = time.perf_counter()
                    self._window_t0 = t_train
                if self.stop:
                    break
            if step >= self.total_steps or self.stop:
                break
        return self._finish(step)

    def _step_inputs(self, step: int) -> tuple[list[np.ndarray], int, float]:
        """The plan's ids per replica, their global count and the lr of (1-based) ``step``."""
        spe = self.plan.steps_per_epoch
        ids = self.plan.step_ids((step - 1) // spe, (step - 1) % spe)
        lr = lr_at(self.spec.optimizer, step - 1, self.total_steps, spe)
        return ids, int(sum(len(i) for i in ids)), lr

    def _flush(self, epochs: int, keep: bool = False) -> None:
        """Gather the window's per-process loss sums and shard digests; the chief writes them."""
        if not self._window:
            return
        n_local = len(self.engine.local_replicas)
        losses = np.array([w[3].loss_sum for w in self._window], dtype=np.float64)
        shard_rows = np.array(
            [
                [int(shard_digest(ids), 16) - (1 << 63), len(ids)]
                for w in self._window
                for ids in w[3].fed_ids
            ],
            dtype=np.int64,
        )
        if shard_rows.shape[0] != len(self._window) * n_local:
            raise RuntimeError("engine returned fed_ids for the wrong number of replicas")
        all_losses = self.engine.gather(losses)  # (processes, window)
        all_shards = self.engine.gather(shard_rows.reshape(len(self._window), n_local, 2))
        now = time.perf_counter()
        elapsed = now - self._window_t0
        self._window_t0 = now
        window_samples = sum(w[4] for w in self._window)
        sps = window_samples / elapsed if elapsed > 0 else 0.0
        if self.writer is not None:
            replicas = [r for proc in range(all_shards.shape[0]) for r in self._replicas_of(proc)]
            for i, (step, epoch, lr, out, count) in enumerate(self._window):
                self.writer.train(
                    step=step,
                    epoch=epoch,
                    loss=float(all_losses[:, i].sum()) / count,
                    lr=lr,
                    grad_norm=out.grad_norm,
                    loss_scale=out.loss_scale,
                    skipped=bool(out.skipped),
                    samples=count,
                    samples_per_s=sps,
                    **({} if out.grad_amax is None else {"grad_amax": out.grad_amax}),
                )
                rows = all_shards[:, i].reshape(-1, 2)
                for replica, (digest, n) in sorted(zip(replicas, rows.tolist(), strict=True)):
                    self.writer.shard(
                        step=step,
                        epoch=epoch,
                        replica=replica,
                        digest=f"{(digest + (1 << 63)):016x}",
                        count=n,
                        micro=micro_sizes(n, self.plan.accumulate)
                        if self.plan.accumulate > 1
                        else None,
                    )
        for w in self._window:
            self.samples += w[4]
            self.skipped += int(w[3].skipped)
        step, epoch, lr, out, count = self._window[-1]
        loss = float(all_losses[:, -1].sum()) / count
        scale = f" scale {out.loss_scale:g}" if self.spec.precision.dtype.value == "fp16" else ""
        self.out.advance(step, epoch, loss=loss, rate=sps)
        text = (
            f"epoch {epoch}/{epochs} step {step}/{self.total_steps} loss {loss:.4f} lr {lr:.4g}"
            f"{scale} {sps:,.0f} samples/s"
        )
        if keep:  # the end of an epoch stays on screen under the live bar too
            self.out.line(text)
        else:
            self.out.logged(text)
        self._window = []

    def _replicas_of(self, process: int) -> list[int]:
        per = len(self.engine.local_replicas)
        return list(range(process * per, (process + 1) * per))

    def _evaluate(self, step: int, epoch: int) -> None:
        """The test split, and the validation split where there is one, scored by every replica's
        slice; one eval record (the validation's fields prefixed val_)."""
        row: dict[str, Any] = {"step": step, "epoch": epoch}
        said = []
        t_eval = time.perf_counter()
        with self._averaged():  # train.ema.evaluate: once for both splits
            for split, prefix in ((TEST, ""), (VALIDATION, "val_")):
                if split not in self.eval_ranges:
                    continue
                local = [self.eval_ranges[split][r] for r in self.engine.local_replicas]
                with self.out.busy(f"evaluating on {self.data.size(split):,} {split} samples"):
                    ev = self.engine.evaluate(split, local)
                value = ev.metric_sum / ev.count
                row |= {
                    f"{prefix}loss": ev.loss_sum / ev.count,
                    f"{prefix}{self.metric}": value,
                    f"{prefix}count": int(ev.count),
                }
                shown = f"{100 * value:.2f}%" if self.metric == "accuracy" else f"{value:.4g}"
                said.append(
                    f"{split} loss {ev.loss_sum / ev.count:.4f} {self.metric} {shown} "
                    f"({int(ev.count)} samples)"
                )
        self.eval_time += time.perf_counter() - t_eval
        self.last_eval = row
        if self.stopper is not None:
            row |= self._early_stopping(row, step)
        if self.writer is not None:
            self.writer.eval(**row)
        self.say(f"eval after step {step}: " + "; ".join(said))
        if self.stop:
            s = self.stopper
            assert s is not None  # only early stopping stops
            self.say(
                f"early stopping after step {step}: {s.metric} has not improved by more than "
                f"{s.min_delta:g} for {s.wait} evaluation(s); best {s.best:.6g} after step "
                f"{s.best_step}" + (" (weights_best.npz)" if self.spec.train.keep_best else "")
            )

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
        if improved and self.spec.train.keep_best:
            weights = self.engine.weights()  # every process: an engine may gather for it
            if self.writer is not None:
                assert self.run_dir is not None  # a writer implies a run directory
                save_weights(Path(self.run_dir) / WEIGHTS_BEST, weights)
        return {"best": improved, **({"stop": True} if stop else {})}

    @contextlib.contextmanager
    def _averaged(self) -> Iterator[None]:
        """With train.ema.evaluate: the averaged weights swapped in for an evaluation (both
        splits), the live ones back afterwards, bit for bit; otherwise nothing."""
        ema = self.spec.train.ema
        if ema is None or not ema.evaluate:
            yield
            return
        live = self.engine.weights()
        self.engine.load_weights(self.engine.ema_weights())
        try:
            yield
        finally:
            self.engine.load_weights(live)

    def _finish(self, steps: int) -> dict[str, Any]:
        weights = self.engine.weights()
        averaged = self.engine.ema_weights() if self.spec.train.ema is not None else None
        spec = self.spec
        n_probes = len(self._probe_index)
        if self.probe_role is not None and self.probe_role.mode == "replay" and self._probe_index:
            with self.out.busy(f"probing {n_probes} steps from the fp64 run's states"):
                self._replay_probes()
        summary = {
            "backend": self.engine.backend,
            "name": spec.name,
            "world_size": self.world,
            "precision": spec.precision.dtype.value,
            "device": spec.distribution.device.value,
            "steps": steps,
            "epochs_run": round(steps / self.plan.steps_per_epoch, 4),
            "samples": self.samples,
            "skipped_steps": self.skipped,
            "wall_s": round(time.perf_counter() - self.started, 3),
            "train_wall_s": round(self.train_time, 3),
            "train_samples_per_s": self.samples / self.train_time if self.train_time else 0.0,
            "eval_wall_s": round(self.eval_time, 3),
            # where the process's time went before training (dualtrain.runtime.clock)
            "startup": clock.startup(),
            "ended_at": time.time(),
            "test_loss": self.last_eval.get("loss"),
            "test_accuracy": self.last_eval.get("accuracy"),
            "test_mae": self.last_eval.get("mae"),
            "test_count": self.last_eval.get("count"),
            "validation_loss": self.last_eval.get("val_loss"),
            "validation_accuracy": self.last_eval.get("val_accuracy"),
            "validation_mae": self.last_eval.get("val_mae"),
            "validation_count": self.last_eval.get("val_count"),
            "loss": spec.model.loss.value,
            "metric": self.metric,
            "dataset": spec.data.dataset.value,
            "data_sha256": self.data.sha256,
            "model_sha256": self.model_sha256 or None,
            "weights_final_digest": weights_digest(weights),
            "data_source": self.data.source,
            "sharding": spec.data.sharding.value,
            "steps_per_epoch": self.plan.steps_per_epoch,
            "determinism": spec.determinism,
            "checkpoints_written": self.checkpoints,
            "checkpoint_wall_s": round(self.checkpoint_s, 3),
            "resumed": self.history,
            "early_stopping": self.stopper.summary() if self.stopper is not None else None,
            "attempt": self.attempt,
            "probes": (
                {
                    "mode": self.probe_role.mode,
                    "steps": n_probes,
                    "source": str(self.probe_role.source or ""),
                }
                if self.probe_role is not None
                else None
            ),
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                **self.engine.versions(),
            },
            **self.extra_summary,
        }
        if self.writer is not None:
            assert self.run_dir is not None  # a writer implies a run directory
            save_weights(Path(self.run_dir) / WEIGHTS_FINAL, weights)
            if averaged is not None:
                save_weights(Path(self.run_dir) / WEIGHTS_EMA, averaged)
            self.writer.summary(summary)
            self.writer.close()
        self.out.finish()
        final = self.last_eval.get(self.metric)
        shown = (
            "n/a"
            if final is None
            else (f"{100 * final:.2f}%" if self.metric == "accuracy" else f"{final:.4g}")
        )
        self.say(
            f"done: {steps} steps in {summary['train_wall_s']:.1f}s "
            f"({summary['train_samples_per_s']:,.0f} samples/s), test {self.metric} {shown}"
        )
        return summary
