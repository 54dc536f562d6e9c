"""The torch array namespace for dualtrain.update_rules: only the global gradient norm (torch.optim
and GradScaler stay the reference for the update rules and the loss scale)."""

from __future__ import annotations

import torch

from dualtrain.update_rules import NormOps

# torch.nn.utils.clip_grad_norm_'s own formula, the norm of the per-tensor norms (get_total_norm;
# on CPU its torch._foreach_norm is torch.linalg.vector_norm per tensor): the recorded grad_norm
# and the clipping are bit for bit clip_grad_norm_'s. Before the formula was shared the torch
# engine took the square root of the sum of one BLAS dot per tensor, recorded as faster than
# get_total_norm on CPU and closer to the float64 value on MNIST gradients (2e-7 vs 1e-6 relative).
# Measured again when this replaced it (the MLP's all-reduced gradients at 12 steps of an epoch,
# 2 CPU threads), relative to the float64 norm: dots 1.1e-6 median, 2.2e-6 max; vector_norm 1.9e-6
# median, 7.5e-6 max (the recorded grad_norm moved by up to 1.7e-5 relative over the epoch); per
# step 71 us (dots), 63 us (this), 100 us (get_total_norm, with its grouping by device and dtype).
NORM_OPS = NormOps(norm=torch.linalg.vector_norm, stack=torch.stack)
