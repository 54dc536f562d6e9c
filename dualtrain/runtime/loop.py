"""The training loop policy shared by both backends (framework-free).

A backend supplies an :class:`Engine` (the mechanics: a train step, distributed evaluation, a
gather, the weights). :class:`TrainLoop` owns everything else, once for both, composed of parts
that each do one thing: what each step is fed (:mod:`~dualtrain.runtime.feed`: the plan's ids per
replica, the loss normaliser, the schedule's lr), when to log, evaluate, checkpoint and probe
(:mod:`~dualtrain.runtime.cadence`), the records of the steps since the last flush
(:mod:`~dualtrain.runtime.window`), evaluation and early stopping
(:mod:`~dualtrain.runtime.evaluation`), checkpoints (:mod:`~dualtrain.runtime.autosave`), the
one-step probes (:mod:`~dualtrain.runtime.probes`) and summary.json
(:mod:`~dualtrain.runtime.summary`). So the two backends cannot disagree on policy, only on
numerics.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core import ema as ema_rule
from dualtrain.core.data import TRAIN, Data
from dualtrain.core.plan import ShardPlan, micro_batches
from dualtrain.core.weights import save_arrays, save_weights
from dualtrain.errors import UserError
from dualtrain.records.record import WEIGHTS_EMA, WEIGHTS_FINAL, RunWriter, layers_file
from dualtrain.runtime import probes
from dualtrain.runtime.autosave import Checkpointer, planted_exit
from dualtrain.runtime.cadence import Cadence, Tick
from dualtrain.runtime.checkpoint import EMA_SLOT, Checkpoint
from dualtrain.runtime.context import Counters, RunContext
from dualtrain.runtime.engine import Engine
from dualtrain.runtime.evaluation import Evaluator, shown
from dualtrain.runtime.feed import Feed
from dualtrain.runtime.progress import Reporter
from dualtrain.runtime.start import steps_total
from dualtrain.runtime.summary import summary
from dualtrain.runtime.window import Entry, Window
from dualtrain.spec import Experiment


class TrainLoop:
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
        probe: probes.Role | None = None,
    ):
        self.spec = spec
        self.model_sha256 = model_sha256  # a model pair's (dualtrain.core.pair); "" otherwise
        self.engine = engine
        self.data = data
        self.plan = ShardPlan.from_spec(spec, data.size(TRAIN))
        self.total_steps = steps_total(spec, self.plan)
        self.feed = Feed(self.plan, spec.optimizer, self.total_steps)
        chief = engine.rank == 0
        # A resumed run appends to records the launcher cut back to the checkpoint's step.
        self.writer = (
            RunWriter(run_dir, append=resume is not None, tensorboard=spec.logging.tensorboard)
            if chief and run_dir is not None
            else None
        )
        self.run_dir = run_dir
        self.resume = resume
        self.start_step = resume.step if resume is not None else 0
        self.step = self.start_step
        """The last step begun (error messages say where a run stopped)."""
        self.attempt = attempt
        self.extra_summary = extra_summary or {}
        self.started = started or time.perf_counter()
        self.out = Reporter(
            f"[{engine.backend}]", spec.logging.progress, self.total_steps, enabled=chief
        )
        self.counters = (
            Counters.from_checkpoint(resume.state["loop"]) if resume is not None else Counters()
        )
        ctx = RunContext(
            spec, engine, data, self.feed, self.writer, run_dir, self.out, self.counters
        )
        # Teacher-forced one-step probes (dualtrain.runtime.probes): compare asks the fp64 reference
        # run to record states, and the requested-precision runs to replay them after training.
        self.prober = probes.Prober(ctx, probe)
        self.cadence = Cadence.of(
            spec.train,
            self.total_steps,
            self.plan.steps_per_epoch,
            record_probes=self.prober.record_at,
            dump_grads=frozenset(spec.debug.dump_grads),
            stop_after=spec.debug.stop_after,
        )
        self._poison = {tuple(p) for p in spec.debug.nonfinite_grad}
        self.window = Window(
            ctx,
            accumulate=self.plan.accumulate,
            total_steps=self.total_steps,
            epochs=self.cadence.epochs,
            show_scale=spec.precision.dtype.value == "fp16",
        )
        self.evaluator = Evaluator(ctx)
        self.checkpointer = Checkpointer(ctx, attempt=attempt, model_sha256=model_sha256)
        self.history = self._history(resume)
        if resume is not None and self.evaluator.stopper is not None:
            loop = resume.state["loop"]
            if "stopping" in loop:  # early stopping goes on where the checkpoint left it
                self.evaluator.stopper.load(loop["stopping"])

    def _history(self, resume: Checkpoint | None) -> list[dict[str, Any]]:
        """summary.json's ``resumed``: the checkpoint's history, then this start."""
        if resume is None:
            return []
        return [
            *resume.state.get("history", []),
            {
                "from_step": resume.step,
                "checkpoint": str(resume.path),
                "backend": self.engine.backend,
                "world_size": self.spec.distribution.world_size,
                "checkpoint_backend": resume.state["backend"],
                "checkpoint_world_size": resume.state["world_size"],
            },
        ]

    def say(self, text: str) -> None:
        self.out.line(text)

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self.out.finish()  # a failed run leaves no half-drawn bar before its error

    def _run(self) -> dict[str, Any]:
        spec, plan, cadence = self.spec, self.plan, self.cadence
        self.say(
            f"{spec.name}: {spec.model.preset or 'custom'} model, "
            f"world_size {spec.distribution.world_size}, "
            f"{spec.precision.dtype.value}, {self.data.size(TRAIN)} train samples, "
            f"{plan.steps_per_epoch} steps/epoch, {self.total_steps} steps"
        )
        self._agree_on_start()
        self._start_ema()
        t_train = time.perf_counter()
        self.window.restart_clock(t_train)
        self.out.start(self.start_step, cadence.epochs)
        step = self.start_step
        for tick in cadence.ticks(self.start_step):
            step = self.step = tick.step
            self._train_step(tick)
            if cadence.log(tick):
                self.window.flush(keep=tick.end_of_epoch)
            if cadence.evaluate(tick):
                self.counters.train_time += time.perf_counter() - t_train
                self.evaluator.evaluate(step, tick.epoch)
                t_train = time.perf_counter()
                self.window.restart_clock(t_train)  # samples/s counts training time only
            if cadence.checkpoint(tick, self.evaluator.stop):
                self.window.flush()  # the records are complete up to this step
                self.counters.train_time += time.perf_counter() - t_train
                self.checkpointer.write(
                    step, tick.epoch, self.counters, self.evaluator.stopper, self.history
                )
                t_train = time.perf_counter()
                self.window.restart_clock(t_train)
            if self.evaluator.stop:
                break
        return self._finish(step)

    def _agree_on_start(self) -> None:
        """Every process starts at the same step (a resumed run's checkpoint step)."""
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

    def _start_ema(self) -> None:
        """train.ema: the average starts as the weights, or as the checkpoint's."""
        ema = self.spec.train.ema
        if ema is None:
            return
        held = self.resume.optimizer.slots if self.resume is not None else {}
        saved = {k[len(EMA_SLOT) :]: v for k, v in held.items() if k.startswith(EMA_SLOT)}
        if saved:
            assert self.resume is not None  # only a checkpoint holds a saved average
            self.engine.load_ema({**self.resume.weights, **saved})
        else:
            self.engine.ema(ema_rule.COPY, ema.decay)

    def _train_step(self, tick: Tick) -> None:
        """One step: the planted faults, the fp64 run's probe, the step, train.ema, the window."""
        step, engine = tick.step, self.engine
        planted_exit(
            self.spec,
            engine,
            step,
            first_attempt=not self.attempt and self.resume is None,
        )
        feed = self.feed.at(step)
        local = [feed.ids[r] for r in engine.local_replicas]
        poison = [(step, r) in self._poison for r in engine.local_replicas]
        if self.cadence.record_probe(tick):
            self.prober.record(step, local, feed.count, feed.lr)
        if step in self.spec.debug.dump_layers and self.writer is not None:
            self._tap(local[0], step)
        dump = self.cadence.dump_grad(tick)
        out = engine.train_step(
            local, lr=feed.lr, global_count=feed.count, poison=poison, capture_grads=dump, step=step
        )
        ema = self.spec.train.ema
        if ema is not None:
            todo = ema_rule.action(ema, step)
            if todo is not None:
                engine.ema(todo, ema.decay)
        self.prober.saw(step, out)
        if out.grads is not None and self.writer is not None and dump:
            assert self.run_dir is not None  # a writer implies a run directory
            save_weights(Path(self.run_dir) / f"grads_step{step}.npz", out.grads)
        self.window.add(Entry(step, tick.epoch, feed.lr, out, feed.count))
        self.out.advance(step, tick.epoch)

    def _tap(self, ids: np.ndarray, step: int) -> None:
        """debug.dump_layers: the chief's first micro-batch through every layer, before the step."""
        taps = self.engine.tap_layers(micro_batches(ids, self.plan.accumulate)[0], step)
        if taps is not None:
            assert self.run_dir is not None  # a writer implies a run directory
            save_arrays(Path(self.run_dir) / layers_file(step), taps)

    def _finish(self, steps: int) -> dict[str, Any]:
        engine, spec = self.engine, self.spec
        weights = engine.weights()
        averaged = engine.ema_weights() if spec.train.ema is not None else None
        n_probes = len(self.prober.index)
        if self.prober.replays:
            with self.out.busy(f"probing {n_probes} steps from the fp64 run's states"):
                self.prober.replay()
        metric = self.evaluator.metric
        result = summary(
            spec,
            backend=engine.backend,
            versions=engine.versions(),
            steps=steps,
            steps_per_epoch=self.plan.steps_per_epoch,
            counters=self.counters,
            wall_s=time.perf_counter() - self.started,
            data=self.data,
            model_sha256=self.model_sha256,
            weights=weights,
            checkpoints=(self.checkpointer.written, self.checkpointer.seconds),
            history=self.history,
            stopper=self.evaluator.stopper,
            attempt=self.attempt,
            probes=self.prober.summary(n_probes),
            metric=metric,
            extra=self.extra_summary,
        )
        if self.writer is not None:
            assert self.run_dir is not None  # a writer implies a run directory
            save_weights(Path(self.run_dir) / WEIGHTS_FINAL, weights)
            if averaged is not None:
                save_weights(Path(self.run_dir) / WEIGHTS_EMA, averaged)
            self.writer.summary(result)
            self.writer.close()
        self.out.finish()
        self.say(
            f"done: {steps} steps in {result['train_wall_s']:.1f}s "
            f"({result['train_samples_per_s']:,.0f} samples/s), test {metric} "
            f"{shown(metric, self.counters.last_eval.get(metric))}"
        )
        return result
