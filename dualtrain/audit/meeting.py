"""Where a run's recorders meet before anything is written: every process (a DDP rank, a
MultiWorkerMirroredStrategy worker) posts a key and waits for every other's, so a recorder made in
some processes only is a one-line error in those that made one (not a collective that pairs with
the framework's own, nor a record that waits at its end for parts no one writes). Each backend
supplies its key-value store: torch the process group's, TensorFlow the coordination service's."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from dualtrain.errors import UserError

#: how long a recorder waits for the others' (DUALTRAIN_AUDIT_WAIT_S)
WAIT_S = 120.0
#: after how long a waiting recorder says so
SAY_AFTER_S = 10.0
_MADE = [0]  # the meetings this process has begun: its n-th recorder meets the others' n-th


def meet(
    rank: int,
    ranks: int,
    post: Callable[[str], None],
    present: Callable[[str], bool],
    *,
    noun: str,
    when: str,
) -> None:
    """Post this process's key and wait until every process's is present. ``noun``: what the
    processes are called ("rank", "worker"); ``when``: where the recorders meet."""
    _MADE[0] += 1
    prefix = f"dualtrain/audit/{_MADE[0]}/"
    post(f"{prefix}{rank}")
    wait = float(os.environ.get("DUALTRAIN_AUDIT_WAIT_S", WAIT_S))
    start, missing, said = time.monotonic(), list(range(ranks)), False
    while missing:
        missing = [r for r in missing if not present(f"{prefix}{r}")]
        waited = time.monotonic() - start
        if missing and waited > wait:
            raise UserError(
                f"make the audit recorder in every {noun} ({when}): {noun}(s) {missing} made "
                f"none in {wait:g} s (DUALTRAIN_AUDIT_WAIT_S). Received: a recorder in {noun} "
                f"{rank} of {ranks}"
            )
        if missing and waited > SAY_AFTER_S and not said:
            said = True
            print(
                f"dualtrain audit: {noun} {rank} waits for the recorders of {noun}(s) {missing} "
                f"(every {noun} makes one; an error after {wait:g} s)",
                file=sys.stderr,
            )
        if missing:
            time.sleep(0.05)
