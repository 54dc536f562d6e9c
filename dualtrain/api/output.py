"""What the Python API prints of its own: lines on stdout, or nothing (``quiet=True``)."""

from __future__ import annotations

import contextlib
import io
from typing import Any


def say(text: str) -> None:
    print(text, flush=True)


def silenced(quiet: bool) -> contextlib.AbstractContextManager[Any]:
    """quiet: this process's own stdout lines go nowhere while runs start (the launcher's
    ``dualtrain: torch run -> DIR``); the workers write to the inherited stdout and still show, and
    warnings and errors (stderr) are kept."""
    return contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()
