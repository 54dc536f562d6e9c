"""The torch array namespaces: for dualtrain.core.update_rules only the global gradient norm
(torch.optim and GradScaler stay the reference for the update rules and the loss scale); for
dualtrain.core.losses torch's own loss kernels, and what a loss's absolute scale needs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dualtrain.core.losses import HUBER_DELTA, LossOps, ScaleOps
from dualtrain.core.ops import NormOps


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

LOSS_OPS = LossOps(
    cross_entropy_sum=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
    binary_cross_entropy=lambda out, t: F.binary_cross_entropy_with_logits(
        out, t, reduction="none"
    ),
    squared_difference=lambda out, t: F.mse_loss(out, t, reduction="none"),
    huber=lambda out, t: F.huber_loss(out, t, reduction="none", delta=HUBER_DELTA),
    like=lambda y, out: y.to(out.dtype),
    mean_columns=lambda x: x.mean(dim=1),
    total=lambda x: x.sum(),
    equal=lambda a, b: a == b,
    argmax=lambda out: out.argmax(dim=1),
    count=lambda hit: hit.sum().double(),
    fraction=lambda hit, out: hit.to(out.dtype),
    to_float64=lambda x: x.double(),
)

SCALE_OPS = ScaleOps(
    logsumexp=lambda out: torch.logsumexp(out, dim=1),
    pick=lambda out, y: out.gather(1, y[:, None])[:, 0],
    clamp0=lambda x: x.clamp(min=0),
    log1p=torch.log1p,
    exp=torch.exp,
    minimum=lambda x, c: x.clamp(max=c),
    mean_columns=lambda x: x.mean(dim=1),
    total=lambda x: x.sum(),
)
