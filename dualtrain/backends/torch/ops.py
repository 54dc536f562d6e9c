"""The torch array namespace for dualtrain.core.update_rules: only the global gradient norm
(torch.optim and GradScaler stay the reference for the update rules and the loss scale)."""

from __future__ import annotations

import torch

from dualtrain.core.update_rules import NormOps


def _l2(x: torch.Tensor) -> torch.Tensor:
    """The L2 norm of all of x's elements as the square root of one BLAS dot."""
    flat = x.reshape(-1)
    return torch.sqrt(torch.dot(flat, flat))


# The formula is clip_grad_norm_'s (the norm of the per-tensor norms, as on the tf side); each norm
# is the square root of one BLAS dot, as the torch engine computed its norm before the formula was
# shared. Measured when choosing (the MLP's all-reduced gradients at 12 steps of an epoch, 2 CPU
# threads), relative to the float64 norm: dots 1.1e-6 median, 2.2e-6 max; torch.linalg.vector_norm
# (clip_grad_norm_'s kernel) 1.9e-6 median, 7.5e-6 max, which moved the recorded grad_norm by up
# to 1.7e-5 relative over an epoch; per step 71 us (dots), 63 us (vector_norm), 100 us
# (get_total_norm, with its grouping by device and dtype). So the dots: the recorded value stays
# as close to float64 as before, and differs from clip_grad_norm_'s by a few float32 ulps.
NORM_OPS = NormOps(norm=_l2, stack=torch.stack)
