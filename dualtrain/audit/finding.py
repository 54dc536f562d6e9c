"""Where a finding of two recorded runs points: the script line to change (:func:`fix`) and where
a script makes its optimizer. The check and the finding themselves are dualtrain.records.verdict's,
the model every compare shares; the audit's checks are made by :func:`judged_check`."""

from __future__ import annotations

from dualtrain.audit.read import Recorded

#: an optimizer's construction line, in either framework's scripts
OPT_LINES = ("optim.", "optimizers.")


#: where a Hugging Face Trainer script sets its optimizer, schedule and clipping
TRAINING_ARGUMENTS = ("TrainingArguments(", "learning_rate=")


def hf_trainer(run: Recorded) -> bool:
    """A torch record of a Hugging Face Trainer (its optimizer, schedule and clipping are set by
    TrainingArguments, under their names: learning_rate, warmup_steps, max_grad_norm, ...)."""
    return run.config.trainer == "transformers"


def opt_lines(run: Recorded) -> tuple[str, ...]:
    """Where ``run``'s script makes its optimizer: its recorded class first (a script with
    argparse branches for several optimizers has the one it ran quoted), then any optimizer (a
    Hugging Face Trainer's: its TrainingArguments)."""
    if hf_trainer(run):
        return TRAINING_ARGUMENTS
    kind = run.config.optimizer.type
    return (f"{kind}(", f'"{kind.lower()}"', *OPT_LINES) if kind else OPT_LINES


#: where each framework's scripts set their schedule
SCHEDULE_LINES = {
    "torch": ("lr_scheduler.", "Scheduler(", "LR(", "scheduler"),
    "tf": ("LearningRateScheduler", "schedules.", "ReduceLROnPlateau", "def decay", "def schedule"),
}


def schedule_lines(run: Recorded) -> tuple[str, ...]:
    """Where ``run``'s script sets its schedule: its recorded scheduler (torch) or
    LearningRateSchedule (Keras: the optimizer's learning_rate, when a schedule) first."""
    if hf_trainer(run):
        return ("warmup_steps=", "lr_scheduler_type=", *TRAINING_ARGUMENTS)
    if run.framework == "torch":
        kind = run.config.scheduler.type
        if not kind:  # no scheduler ran: where one would go, not a branch that did not run
            return opt_lines(run)
    else:
        kind = run.config.optimizer.get("learning_rate")
        if not isinstance(kind, str):  # a number: a callback set it (fit's lr callbacks first)
            called = [f"{c['type']}(" for c in run.config.lr_callbacks]
            return (*called, *CALLBACK_LINES, *SCHEDULE_LINES["tf"])
    specific = (f"{kind}(",) if isinstance(kind, str) else ()
    return (*specific, *SCHEDULE_LINES[run.framework])


#: where a Keras script sets its lr from a callback
CALLBACK_LINES = ("LearningRateScheduler", "ReduceLROnPlateau", "on_epoch_begin", "learning_rate")


def fix(
    run: Recorded, tag: str, needles: tuple[str, ...], change: str, at: int | None = None
) -> str:
    """``A (torch) ddp_mnist.py:88: <the line> -> change`` (the script's line when found; line
    ``at`` where the recorder saw the call run there)."""
    where = (run.line_at(at) if at else None) or run.line_of(*needles)
    return f"{tag} ({run.framework}) {where or run.script_name} -> {change}"
