"""When the training loop does what (framework-free, pure): which steps a run takes from where it
starts, where each epoch ends, and on which of them it logs, evaluates, checkpoints, records a probe
or saves the gradient. :class:`~dualtrain.runtime.loop.TrainLoop` asks; nothing here has a side
effect, so every rule is a unit test (tests/runtime/test_cadence.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dualtrain.spec import Every, TrainSpec


@dataclass(frozen=True)
class Tick:
    """One training step as the loop sees it."""

    step: int
    """1-based global step."""
    epoch: int
    """1-based epoch the step belongs to."""
    end_of_epoch: bool
    """The epoch's last step, or the run's last step (a run cut by max_steps ends its epoch
    there)."""
    last: bool
    """The run's last step."""


@dataclass(frozen=True)
class Cadence:
    total_steps: int
    steps_per_epoch: int
    epochs: int
    """Epochs the run spans (the last may be cut by max_steps)."""
    log_every: int
    eval_every: int
    """0: at the end of every epoch."""
    checkpoint_every: Every | int | None
    record_probes: frozenset[int] = frozenset()
    """Steps whose one-step probe the fp64 reference run records (dualtrain.runtime.probes)."""
    dump_grads: frozenset[int] = frozenset()
    """Steps whose all-reduced gradient the run saves (debug.dump_grads)."""
    stop_after: int | None = None
    """debug.stop_after: the run ends after this step as after its last (the schedule and the
    plan still those of the whole run)."""

    @classmethod
    def of(
        cls,
        train: TrainSpec,
        total_steps: int,
        steps_per_epoch: int,
        *,
        record_probes: frozenset[int] = frozenset(),
        dump_grads: frozenset[int] = frozenset(),
        stop_after: int | None = None,
    ) -> Cadence:
        """From the spec's ``train`` section and the plan's sizes."""
        epochs = train.epochs or -(-total_steps // steps_per_epoch)
        return cls(
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            epochs=epochs,
            log_every=train.log_every,
            eval_every=train.eval_every,
            checkpoint_every=train.checkpoint_every,
            record_probes=record_probes,
            dump_grads=dump_grads,
            stop_after=stop_after,
        )

    def ticks(self, start: int) -> Iterator[Tick]:
        """The steps after ``start`` (0, or a checkpoint's step) to the end of the run."""
        spe = self.steps_per_epoch
        end = min(self.total_steps, self.stop_after or self.total_steps)
        for step in range(start + 1, end + 1):
            last = step == end
            yield Tick(step, (step - 1) // spe + 1, step % spe == 0 or last, last)

    def log(self, tick: Tick) -> bool:
        """Flush the records and print a progress line: every log_every steps and at the end of
        every epoch."""
        return tick.step % self.log_every == 0 or tick.end_of_epoch

    def evaluate(self, tick: Tick) -> bool:
        """Every eval_every steps, or at the end of every epoch (eval_every 0); always after the
        run's last step."""
        if self.eval_every:
            return tick.step % self.eval_every == 0 or tick.last
        return tick.end_of_epoch

    def checkpoint(self, tick: Tick, stopping: bool) -> bool:
        """Every checkpoint_every steps or at the end of every epoch (``epoch``); a run that
        checkpoints at all also writes one after its last step and where early stopping ends
        it."""
        every = self.checkpoint_every
        if every is None:
            return False
        if tick.last or stopping:
            return True
        return tick.end_of_epoch if every is Every.EPOCH else tick.step % every == 0

    def record_probe(self, tick: Tick) -> bool:
        return tick.step in self.record_probes

    def dump_grad(self, tick: Tick) -> bool:
        return tick.step in self.dump_grads
