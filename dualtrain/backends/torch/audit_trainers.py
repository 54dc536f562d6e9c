"""The torch recorder inside the trainers teams run: a PyTorch Lightning ``Callback`` (each
optimizer step's rows from ``on_train_batch_start``, its loss from ``on_train_batch_end``) and a
Hugging Face ``TrainerCallback`` (the rows and loss read from the model's training forwards, the
step closed at ``on_step_end``), each feeding a TorchRecorder made on the trainer's own model,
optimizer, scheduler, GradScaler and train loader when training starts.

A recorder failure never stops the user's training: it is said once on stderr, the folder is
marked failed (compare refuses it), and training goes on unrecorded."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import torch

from dualtrain.audit import record
from dualtrain.backends.torch.audit import TorchRecorder


def _lightning() -> Any:
    """The Lightning package the script imported (``lightning.pytorch`` or the older
    ``pytorch_lightning``: a Trainer accepts only its own package's callbacks)."""
    if "lightning.pytorch" in sys.modules or "pytorch_lightning" not in sys.modules:
        return importlib.import_module("lightning.pytorch")  # lazy: heavy
    return importlib.import_module("pytorch_lightning")  # lazy: heavy


def _first(found: Any) -> Any:
    return found[0] if isinstance(found, (list, tuple)) and found else found


class Recording:
    """One trainer's recording: a TorchRecorder fed per micro-batch, its losses averaged into the
    optimizer step's, any failure said once on stderr and the recording dropped (the folder
    marked failed), never raised into the training."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.rec: TorchRecorder | None = None
        self.losses: list[float] = []
        self.failed = False

    def _fail(self, where: str, error: BaseException) -> None:
        if not self.failed:
            record.say_stopped(where, error)
        self.failed = True
        if self.rec is not None:  # (a recorder that failed to start cleaned up itself)
            self.rec.__exit__(type(error), error, None)

    def start(self, where: str, **parts: Any) -> None:
        try:
            self.rec = TorchRecorder(self.run_dir, **parts)
        except Exception as e:  # noqa: BLE001  (said, and training goes on)
            self._fail(where, e)

    def batch(self, where: str, batch: Any, epoch: int) -> None:
        if self.rec is not None and not self.failed:
            try:
                self.rec.batch(batch, epoch=epoch)
            except Exception as e:  # noqa: BLE001
                self._fail(where, e)

    def end(self, where: str, loss: Any, boundary: bool) -> None:
        """A micro-batch's end: its loss kept; the step's (their mean) recorded where the
        optimizer stepped or the accumulation's ``boundary`` is reached."""
        if self.rec is None or self.failed:
            return
        try:
            if loss is not None:
                self.losses.append(float(loss.detach()))
            if self.rec.stepped or boundary:
                mean = sum(self.losses) / len(self.losses) if self.losses else float("nan")
                self.rec.step(mean)
                self.losses = []
        except Exception as e:  # noqa: BLE001
            self._fail(where, e)

    def close(self, where: str) -> None:
        if self.rec is not None and not self.failed:
            try:
                self.rec.close()
            except Exception as e:  # noqa: BLE001
                self._fail(where, e)

    def abandon(self, error: BaseException) -> None:
        if self.rec is not None and not self.failed:
            self.rec.__exit__(type(error), error, None)


def _made(base: Any, hooks: type, run_dir: str | Path) -> Any:
    """A callback of the trainer's own class ``base`` (whichever the script imported) with
    ``hooks``' methods: the trainer accepts only its callback class's instances."""
    return type(hooks.__name__, (hooks, base), {})(run_dir)


class LightningRecorder:
    """dualtrain's audit recorder as a Lightning callback (docs/audit.md)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.recording = Recording(run_dir)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        configs = getattr(trainer, "lr_scheduler_configs", None) or []
        self.recording.start(
            "on_train_start",
            model=getattr(trainer.strategy, "model", None) or pl_module,
            optimizer=_first(trainer.optimizers),
            scaler=getattr(getattr(trainer, "precision_plugin", None), "scaler", None),
            loader=_first(trainer.train_dataloader),
            scheduler=configs[0].scheduler if configs else None,
        )

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
        self.recording.batch("on_train_batch_start", batch, trainer.current_epoch + 1)

    def on_train_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        k = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
        last = i + 1 == getattr(trainer, "num_training_batches", -1)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.recording.end("on_train_batch_end", loss, (i + 1) % k == 0 or last)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.recording.close("on_train_end")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.recording.abandon(exception)


def lightning_callback(run_dir: str | Path) -> Any:
    """A Lightning callback recording ``trainer.fit`` into ``run_dir`` (every process makes one;
    the chief writes the record when training ends)."""
    return _made(_lightning().Callback, LightningRecorder, run_dir)


class TransformersRecorder:
    """dualtrain's audit recorder as a Hugging Face Trainer callback (docs/audit.md). The Trainer
    gives its callbacks no batch and no loss: the recorder reads each training forward's inputs (a
    pre-hook on the model: ``input_ids``, ``pixel_values``, ...) and the loss the model returns
    (``outputs.loss``), or where the model returns none, the loss the Trainer's ``compute_loss``
    returns (a script's own override, a ``label_smoothing_factor``: the Trainer is found in the
    calling frames as training begins), and closes a step at ``on_step_end``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.recording = Recording(run_dir)
        self.epoch = 0
        self.hooks: list[Any] = []
        self.trainer: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        model = kw.get("model")
        self.recording.start(
            "on_train_begin",
            model=model,
            optimizer=kw.get("optimizer"),
            loader=kw.get("train_dataloader"),
            scheduler=kw.get("lr_scheduler"),
        )
        rec = self.recording.rec
        if rec is not None:  # its settings are TrainingArguments' (the fixes use their names)
            rec.config["trainer"] = "transformers"
        if rec is not None and getattr(args.parallel_mode, "value", None) == "distributed":
            rec.config["ddp"] = True  # the Trainer wraps the model its callbacks get in DDP
        if rec is not None and model is not None:
            self.hooks = [
                model.register_forward_pre_hook(self._inputs, with_kwargs=True),
                model.register_forward_hook(self._loss),
            ]
            self.trainer = _calling_trainer()
            if self.trainer is not None:
                self._watch_compute_loss(self.trainer)

    def _watch_compute_loss(self, trainer: Any) -> None:
        """The loss ``trainer.compute_loss`` returns, kept where the model's forward returned
        none (put back as training ends)."""
        original = trainer.compute_loss

        def compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            before = len(self.recording.losses)
            out = original(model, inputs, *args, **kwargs)
            loss = out[0] if isinstance(out, tuple) else out
            mine = self._training(model) and len(self.recording.losses) == before
            if mine and isinstance(loss, torch.Tensor) and not self.recording.failed:
                self.recording.losses.append(float(loss.detach()))
            return out

        trainer.compute_loss = compute_loss

    @staticmethod
    def _training(module: Any) -> bool:
        return bool(module.training) and torch.is_grad_enabled()

    def _inputs(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._training(module):
            self.recording.batch("the model's forward", kwargs or args, max(self.epoch, 1))

    def _loss(self, module: Any, args: Any, output: Any) -> None:
        loss = output.get("loss") if hasattr(output, "get") else None
        if self._training(module) and loss is not None and not self.recording.failed:
            self.recording.losses.append(float(loss.detach()))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.epoch += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.recording.end("on_step_end", None, True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        for h in self.hooks:
            h.remove()
        if self.trainer is not None and "compute_loss" in vars(self.trainer):
            del self.trainer.compute_loss  # the Trainer's own again
        self.recording.close("on_train_end")


def _calling_trainer() -> Any:
    """The Hugging Face Trainer whose training calls its callbacks now (a caller's ``self``), or
    None."""
    trainer_class = getattr(sys.modules.get("transformers"), "Trainer", None)
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and trainer_class is not None:
        me = frame.f_locals.get("self")
        if isinstance(me, trainer_class):
            return me
        frame = frame.f_back
    return None


def transformers_callback(run_dir: str | Path) -> Any:
    """A Hugging Face TrainerCallback recording ``trainer.train()`` into ``run_dir`` (every
    process makes one)."""
    base = importlib.import_module("transformers").TrainerCallback  # lazy: heavy
    return _made(base, TransformersRecorder, run_dir)
