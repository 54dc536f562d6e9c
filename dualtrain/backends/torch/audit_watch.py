"""What the torch recorder watches while the script runs, each put back as it closes: torch's
clipping functions (ClipWatch), the loops over the DataLoader (LoaderLoops: each a new epoch) and
the autocast context of the model's forward (AutocastWatch), the script's lines that step the
scheduler (SchedulerLines), an AveragedModel's moving average of the model (EmaWatch)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any, cast

import torch
from torch.nn.utils import clip_grad

from dualtrain.backends.torch.audit_setup import unwrapped


def _cell(fn: Any) -> Any:
    """The closure cell of torch's ``_no_grad`` wrapper that holds the function it runs."""
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    closure = getattr(fn, "__closure__", None)
    return closure[names.index("func")] if "func" in names and closure else None


class LoaderLoops:
    """How often the script begins a loop over its DataLoader (each a new epoch): DataLoader's
    ``__iter__`` calls the instance's ``_get_iterator`` (and, with persistent workers, its
    iterator's ``_reset``), so wrapping those counts every ``for batch in loader``. A loop that
    leaves its epochs early (``break`` after N batches) without ``set_epoch`` then still has its
    epochs counted, where the loader's length said otherwise."""

    def __init__(self, loader: Any):
        self.loader, self.n, self.seen, self.active = loader, 0, -1, False
        self.ok = isinstance(loader, torch.utils.data.DataLoader) and hasattr(
            loader, "_get_iterator"
        )
        if not self.ok or "_get_iterator" in vars(loader):
            self.ok = False  # not a DataLoader, or another recorder's wrapper
            return
        made = loader._get_iterator

        def get_iterator() -> Any:
            self.n += 1
            it = made()
            reset = getattr(it, "_reset", None)
            if callable(reset):  # persistent workers: one iterator, reset per epoch

                def again(*args: Any, **kwargs: Any) -> Any:
                    self.n += 1
                    return reset(*args, **kwargs)

                it._reset = again
            return it

        loader._get_iterator = get_iterator

    def began(self) -> bool | None:
        """Whether a new loop over the loader began since the last call (None: it cannot be
        told: not a DataLoader, or the script loops over another loader made per epoch)."""
        moved, self.seen = self.seen not in (-1, self.n), self.n
        self.active = self.active or moved
        return moved if self.active else None

    def close(self) -> None:
        if self.ok:
            vars(self.loader).pop("_get_iterator", None)
            self.ok = False


class AutocastWatch:
    """Whether the model's forward runs under autocast, and in which dtype: a forward pre-hook
    on the user's module (inside DDP's: a forward through ``.module`` included) reads
    ``torch.is_autocast_enabled`` at the first forward while recording, the context the script
    wraps its forward in. The compute dtype compare judges against Keras's policy."""

    def __init__(self, model: Any):
        self.seen: dict[str, Any] | None = None
        inner = unwrapped(model)
        params = [p for p in inner.parameters() if p.is_floating_point()]
        self.device = params[0].device.type if params else "cpu"
        self.param_dtype = str(params[0].dtype).removeprefix("torch.") if params else None
        self.handle = inner.register_forward_pre_hook(self._read)

    def _read(self, module: Any, args: Any) -> None:
        if self.seen is None:
            on = torch.is_autocast_enabled(self.device)
            dtype = torch.get_autocast_dtype(self.device) if on else None
            self.seen = {"autocast": str(dtype).removeprefix("torch.") if on else None}
            self.handle.remove()  # one read: no cost per step

    def summary(self) -> dict[str, Any]:
        """``autocast`` and the ``compute_dtype`` it makes (the parameters' without autocast);
        nothing where no forward ran."""
        if self.seen is None:
            return {}
        return {**self.seen, "compute_dtype": self.seen["autocast"] or self.param_dtype}

    def close(self) -> None:
        self.handle.remove()


class ClipWatch:
    """The gradient clipping a loop does, seen as it runs (not read from the script's text, where
    a ``clip_grad_norm_`` under an ``if`` that did not run would count). torch.nn.utils.clip_grad's
    ``_clip_grads_with_norm_`` (which ``clip_grad_norm_`` calls, public as
    ``clip_grads_with_norm_``) and ``clip_grad_value_`` are wrappers that run a function held in
    a closure cell; while recording, the cell holds a function that notes the call, so every
    name a script imported them by is seen; ``close`` puts the functions back. ``step()`` says
    which optimizer step a call belongs to. A torch that lays them out otherwise leaves them
    unwatched (``summary()`` is None: the script's text is the evidence)."""

    def __init__(self, step: Any):
        self.step = step
        self.calls: list[tuple[int, str, float, Any]] = []
        self.cells: list[tuple[Any, Any]] = []
        norm_cell = _cell(getattr(clip_grad, "_clip_grads_with_norm_", None))
        value_cell = _cell(getattr(clip_grad, "clip_grad_value_", None))
        self.watched = norm_cell is not None and value_cell is not None
        if not self.watched:
            return
        scale, clamp = norm_cell.cell_contents, value_cell.cell_contents

        def scaled(parameters: Any, max_norm: float, total_norm: Any, *a: Any, **k: Any) -> Any:
            self.calls.append((self.step(), "clip_grad_norm_", float(max_norm), total_norm))
            return scale(parameters, max_norm, total_norm, *a, **k)

        def clamped(parameters: Any, clip_value: float, *a: Any, **k: Any) -> Any:
            self.calls.append((self.step(), "clip_grad_value_", float(clip_value), None))
            return clamp(parameters, clip_value, *a, **k)

        norm_cell.cell_contents, value_cell.cell_contents = scaled, clamped
        self.cells = [(norm_cell, scale), (value_cell, clamp)]

    def close(self) -> None:
        for cell, fn in self.cells:
            cell.cell_contents = fn
        self.cells = []

    def summary(self, steps: int) -> dict[str, Any] | None:
        """What the loop clipped: each function called, its limits, on how many of the steps,
        and on how many its limit was below the gradient's norm (clip_grad_norm_'s active
        steps); None where the module could not be watched."""
        if not self.watched:
            return None
        out: dict[str, Any] = {"watched": True, "steps": steps, "calls": []}
        for how in ("clip_grad_norm_", "clip_grad_value_"):
            mine = [c for c in self.calls if c[1] == how]
            if not mine:
                continue
            limits = sorted({c[2] for c in mine})
            active = [c for c in mine if c[3] is not None and float(c[3]) > c[2]]
            out["calls"].append(
                {
                    "function": how,
                    "limit": limits[0] if len(limits) == 1 else limits,
                    "steps": len({c[0] for c in mine}),
                    "active_steps": len({c[0] for c in active}) if how.endswith("norm_") else None,
                }
            )
        return out


class SchedulerLines:
    """The lines of the script (``sys.argv[0]``) that call ``scheduler.step()`` while recording,
    so a finding quotes the call that ran, not the first textual match (a script with a
    per-epoch and a per-batch branch). The method is wrapped on the scheduler's class, not the
    instance: a scheduler's ``state_dict`` is its ``__dict__``, which a checkpoint pickles; the
    wrapper notes calls on the recorded scheduler only and ``close`` puts the class back."""

    MAX = 4

    def __init__(self, sched: Any):
        self.lines: list[int] = []
        self.kind: Any = None
        step = getattr(type(sched), "step", None)
        if sched is None or not callable(step):
            return
        script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
        self.kind, self.own = type(sched), "step" in vars(type(sched))
        self.step = step

        mine: dict[str, bool] = {}  # a frame's file name -> whether it is the script

        def ours(name: str) -> bool:
            if name not in mine:
                mine[name] = Path(name).resolve() == script
            return mine[name]

        def noted(this: Any, *args: Any, **kwargs: Any) -> Any:
            if this is sched and len(self.lines) < self.MAX and script is not None:
                frame: FrameType | None = sys._getframe(1)
                while frame is not None and not ours(frame.f_code.co_filename):
                    frame = frame.f_back  # None ends the walk
                if frame is not None and frame.f_lineno not in self.lines:
                    self.lines.append(frame.f_lineno)
            return step(this, *args, **kwargs)

        self.kind.step = noted

    def close(self) -> None:
        if self.kind is None:
            return
        if self.own:
            self.kind.step = self.step
        else:
            del self.kind.step
        self.kind = None


class EmaWatch:
    """A moving average of the recorded model's weights (torch.optim.swa_utils.AveragedModel:
    ``get_ema_multi_avg_fn(decay)``, ``get_ema_avg_fn`` or SWA's equal average), seen as the
    script calls ``update_parameters(model)`` (wrapped on the class, as SchedulerLines, and put
    back on close); at close, whether the model holds the average (the script copied it in, as
    Keras's ``use_ema`` writes it into the model as fit ends)."""

    def __init__(self, model: Any):
        self.model, self.avg, self.updates = unwrapped(model), None, 0
        #: the class whose method is wrapped until close (None: closed)
        self.kind: Any = cast(Any, torch.optim.swa_utils.AveragedModel)
        self.update = self.kind.update_parameters

        def noted(this: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            if unwrapped(model) is self.model:
                self.avg, self.updates = this, self.updates + 1
            return self.update(this, model, *args, **kwargs)

        self.kind.update_parameters = noted  # until close

    def close(self) -> None:
        if self.kind is not None:
            self.kind.update_parameters = self.update
            self.kind = None

    def summary(self) -> dict[str, Any] | None:
        if self.avg is None:
            return None
        fn = self.avg.multi_avg_fn or self.avg.avg_fn
        inner = getattr(fn, "__wrapped__", fn)  # torch.no_grad's wrapper
        names = getattr(getattr(inner, "__code__", None), "co_freevars", ())
        cells = getattr(inner, "__closure__", None) or ()
        decay = cells[names.index("decay")].cell_contents if "decay" in names else None
        mine = list(self.avg.module.parameters())
        held = len(mine) == len(list(self.model.parameters())) and all(
            torch.equal(p, q.to(p.device))
            for p, q in zip(mine, self.model.parameters(), strict=False)
        )
        return {
            "type": "AveragedModel",
            "average": "ema" if decay is not None else ("swa" if fn is None else "custom"),
            "decay": float(decay) if isinstance(decay, (int, float)) else None,
            "updates": self.updates,
            "final_is_average": held,
        }


class Watchers:
    """Every watcher of a recording, put back together on close."""

    def __init__(self, model: Any, loader: Any, scheduler: Any, step: Any):
        self.loops, self.clips = LoaderLoops(loader), ClipWatch(step)
        self.autocast, self.sched = AutocastWatch(model), SchedulerLines(scheduler)
        self.ema = EmaWatch(model)

    def close(self) -> None:
        for w in (self.clips, self.loops, self.autocast, self.sched, self.ema):
            w.close()

    def summary(self, config: dict[str, Any], steps: int) -> None:
        """What the watchers saw, into the record's configuration."""
        average = self.ema.summary()
        if average is not None:
            config["ema"] = average
        config["precision"] |= self.autocast.summary()
        clipping = self.clips.summary(steps)
        if clipping is not None:
            config["clipping"] = clipping
        if self.sched.lines:  # the script's scheduler.step() calls that ran
            config["scheduler"]["step_lines"] = self.sched.lines
