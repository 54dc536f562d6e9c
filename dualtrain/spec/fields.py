"""What every spec section is built from: the one-line range check, the frozen dataclass settings,
and the field policies (cosmetic, free on continuation) declared as field metadata."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from dualtrain.errors import UserError, shown


def _fail(path: str, requirement: str, value: Any) -> UserError:
    return UserError(f"{path} {requirement}. Received: {shown(value)}")


def check_field(cond: bool, path: str, requirement: str, value: Any) -> None:
    if not cond:
        raise _fail(path, requirement, value)


SPEC_DATACLASS = dict(frozen=True, kw_only=True, slots=True)

#: Field policies, declared on the schema (``tagged_field``) and read by :func:`paths_with`:
COSMETIC = "cosmetic"
"""Cannot change the numbers of a run (names, paths, rendezvous, logging): compare lists a
difference but never fails on it or names it as a cause."""
FREE = "free"
"""May differ between a checkpoint and the run that continues it (how the run is distributed and
logged, where the data lies, how often it checkpoints); every other field must match."""
#: Where a difference in the field shows in two runs' records before it shows in their numbers
#: (compare's diagnosis names that record as the cause, not the field on its own):
SHOWS_IN_IDS = "shows in the sample ids"
SHOWS_IN_INIT = "shows in the initial weights"
SHOWS_IN_LR = "shows in the learning rate"
SHOWS_IN_SCALE = "shows in the loss-scale decisions"


def tagged_field(*tags: str, **kwargs: Any) -> Any:
    """A field (``default=`` or ``default_factory=``) carrying the policies ``tags``; on a section,
    they hold for every field in it."""
    return field(metadata={"policy": frozenset(tags)}, **kwargs)
