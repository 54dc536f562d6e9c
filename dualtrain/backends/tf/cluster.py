"""The end of a multi_worker run: its tasks leave together.

A TensorFlow collective completes on the task that sends a part once it has handed the part to its
RPC server, not once the peer has received it. A task that left right after the last collective of
the run closed that server while a peer still fetched its part, and the peer failed with "Socket
closed ... task:1" after the last step (seen in CI, with workers that exit without interpreter
teardown; TensorFlow's own teardown only made the window smaller: MultiWorkerMirroredStrategy
configures no shutdown barrier).

So every task waits at the coordination service's barrier (hosted by task 0) once its run is done:
no task passes it before every task has finished its last collective. Then the other tasks tell
task 0 they are leaving, and task 0 leaves last, after their messages reached it: the only answer a
task does not wait for is the one to that message, which it no longer needs.
"""

from __future__ import annotations

import contextlib

BARRIER = "dualtrain/end"
LEFT = "dualtrain/left/{rank}"
_left: list[bool] = []


def leave_together(rank: int, world: int, timeout_s: float) -> None:
    """Block until every task of the cluster has finished its run; task 0 returns last. A peer lost
    before the barrier raises TensorFlow's error (a lost peer, as in a collective)."""
    from tensorflow.python.eager import context  # lazy: framework (the barrier has no tf.* API)

    ctx = context.context()
    timeout_ms = max(1, int(timeout_s * 1000))
    ctx.wait_at_barrier(BARRIER, timeout_ms)
    if rank != 0:
        with contextlib.suppress(Exception):  # its answer is not needed: task 0 may be gone
            ctx.set_config_key_value(LEFT.format(rank=rank), "1")
    else:
        for other in range(1, world):
            ctx.get_config_key_value(LEFT.format(rank=other), timeout_ms)
    _left.append(True)


def have_left_together() -> bool:
    """Did this process's run end in :func:`leave_together`? Then nothing of TensorFlow's is left
    for its peers and the process may exit without TensorFlow's teardown (about 1 s)."""
    return bool(_left)
