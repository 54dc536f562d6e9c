"""Is an output folder usable? One check for every command that writes one (run, its dry run,
compare, export, and the Python API through them), made before anything is written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dualtrain.errors import UserError


def check_creatable(path: str | Path, what: str = "--out") -> None:
    """Raise a one-line :class:`UserError` unless ``path`` is a folder this process can write into
    or can create (its nearest existing ancestor is a folder in which it can create one).

    The test is the real operation, not a permission guess (root passes every access check; /proc,
    a read-only mount or a full disk say no only when asked): a hidden folder is created in that
    ancestor and removed at once, so nothing of it stays."""
    target = Path(os.path.abspath(path))
    probe = target
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        where = "" if probe == target else f" ({str(probe)!r} is not a folder)"
        raise UserError(
            f"{what} cannot be a folder: something other than a folder is in the "
            f"way{where}. Received: {str(path)!r}"
        )
    try:
        made = tempfile.mkdtemp(prefix=".dualtrain-write-check.", dir=probe)
    except OSError as exc:
        raise UserError(
            f"{what} cannot be written: {exc.strerror or exc} in {str(probe)!r}. "
            f"Received: {str(path)!r}"
        ) from None
    os.rmdir(made)
