"""What the chief prints while it trains (framework-free).

On an interactive terminal (``logging.progress: auto``) one live line at the bottom shows where the
run is: steps done of the total, epoch, the last logged loss, samples/s and the time left; the
lines worth keeping (start, end of each epoch, evaluations, checkpoints, the end) scroll above it.
In a log file or CI the output stays plain lines, one per ``train.log_every`` steps, as before:
nothing there has to parse carriage returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from dualtrain.spec import Progress

_REDRAW_S = 0.2
"""At most five redraws a second: the bar costs nothing next to a step."""


def interactive(stream: TextIO) -> bool:
    """A terminal a person watches: a TTY, not TERM=dumb, not a CI runner's pseudo-terminal."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb" and not os.environ.get("CI")


def clock(seconds: float) -> str:
    seconds = max(int(seconds + 0.5), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Reporter:
    """The chief's output: ``line()`` for lines that stay, ``advance()`` per step for the bar."""

    def __init__(
        self,
        prefix: str,
        mode: Progress,
        total_steps: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
    ):
        self.prefix = prefix
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.bar = enabled and (
            mode is Progress.BAR or (mode is Progress.AUTO and interactive(self.stream))
        )
        self.total = max(total_steps, 1)
        self._shown = False
        self._last_draw = 0.0
        self._t0: float | None = None
        self._step0 = 0
        self.step, self.epoch, self.epochs = 0, 0, 0
        self.loss: float | None = None
        self.rate = 0.0
        self.status = ""

    # ---- lines that stay -------------------------------------------------------------------------
    def line(self, text: str) -> None:
        if not self.enabled:
            return
        self._clear()
        print(f"{self.prefix} {text}", file=self.stream, flush=True)
        if self.bar and self._t0 is not None and self.step < self.total:
            self._draw()

    def logged(self, text: str) -> None:
        """A ``train.log_every`` line: printed in plain mode, shown by the bar otherwise."""
        if not self.bar:
            self.line(text)

    # ---- the live line ---------------------------------------------------------------------------
    def start(self, step: int, epochs: int) -> None:
        self._t0, self._step0, self.step, self.epochs = time.perf_counter(), step, step, epochs

    def advance(
        self, step: int, epoch: int, *, loss: float | None = None, rate: float | None = None
    ) -> None:
        self.step, self.epoch = step, epoch
        if loss is not None:
            self.loss = loss
        if rate is not None:
            self.rate = rate
        self.status = ""
        if self.bar and (time.perf_counter() - self._last_draw >= _REDRAW_S or step == self.total):
            self._draw()

    @contextlib.contextmanager
    def busy(self, status: str) -> Iterator[None]:
        """Something that is not a step (evaluation, a checkpoint) runs inside: the bar says so."""
        self.status = status
        if self.bar and self._t0 is not None:
            self._draw()
        try:
            yield
        finally:
            self.status = ""

    def finish(self) -> None:
        self._clear()

    def render(self, width: int) -> str:
        """The bar's text for a terminal ``width`` columns wide."""
        done = self.step / self.total
        elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        steps_run = self.step - self._step0
        eta = (
            f"ETA {clock(elapsed / steps_run * (self.total - self.step))}"
            if steps_run
            else "ETA --:--"
        )
        parts = [f"{self.step}/{self.total}", f"epoch {self.epoch}/{self.epochs}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.rate:
            parts.append(f"{self.rate:,.0f} samples/s")
        parts.append(self.status or eta)
        tail = " " + " ".join(parts)
        head = f"{self.prefix} train {100 * done:3.0f}% "
        room = width - len(head) - len(tail) - 1
        if room >= 10:
            filled = int(room * done)
            return head + "#" * filled + "-" * (room - filled) + tail
        return (head + tail.strip())[: width - 1]

    def _draw(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        self.stream.write("\r" + self.render(width) + "\x1b[K")
        self.stream.flush()
        self._shown = True
        self._last_draw = time.perf_counter()

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
