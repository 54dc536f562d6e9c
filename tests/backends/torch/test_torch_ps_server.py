"""The torch parameter server's gathering (dualtrain.backends.torch.ps.Server), in one process:
it sums the replicas' gradients in replica order whatever order they arrive in, and refuses a step
the replicas disagree on (the end-to-end runs are parity_tests/test_parameter_server.py)."""

from __future__ import annotations

import pytest
import torch

from dualtrain.backends.torch.ps import Server


class Updates:
    """Stands in for the engine's server_update: records what the server asked it to apply."""

    def __init__(self):
        self.calls: list[tuple[torch.Tensor, float, bool]] = []

    def server_update(self, total: torch.Tensor, lr: float, capture: bool) -> str:
        self.calls.append((total, lr, capture))
        return f"step {len(self.calls)}"


def test_one_update_per_step_from_the_sum_in_replica_order():
    engine = Updates()
    server = Server(engine, world=3)
    big = torch.tensor([2.0**53], dtype=torch.float64)
    small = torch.tensor([1.0], dtype=torch.float64)
    futures = [server.add(r, g, 0.1, False) for r, g in ((2, -big), (0, big), (1, small))]
    assert [f.wait() for f in futures] == ["step 1"] * 3
    # replica order: (2**53 + 1) - 2**53 == 0 in float64; arrival order would give 1
    assert engine.calls[0][0].item() == 0.0 and engine.calls[0][1:] == (0.1, False)
    assert server.add(0, small, 0.1, True) is not futures[0]  # the next step gathers anew


def test_replicas_out_of_step_fail_the_step_instead_of_hanging():
    server = Server(Updates(), world=2)
    grads = torch.zeros(2)
    first, second = server.add(0, grads, 0.1, False), server.add(1, grads, 0.1, True)
    with pytest.raises(RuntimeError, match="disagree on the step's"):
        second.wait()
    assert first is second
