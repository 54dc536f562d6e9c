"""torch's loss kernels (backends/torch/ops.py) against each loss's NumPy reference, in float64;
Huber's is torch's own huber_loss and smooth_l1_loss at their defaults."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualtrain.backends.torch.ops import LOSS_OPS
from dualtrain.core import losses
from dualtrain.core.losses import reference
from dualtrain.spec import Loss
from testkit.synth import loss_batch


@pytest.mark.parametrize("loss", list(Loss))
def test_torch_kernels_compute_the_reference(loss):
    out, y = loss_batch(loss, 1, 32, 4)
    per, metric = reference(loss, out, y)
    o, t = torch.from_numpy(out), torch.from_numpy(y)
    assert np.isclose(float(losses.loss_sum(LOSS_OPS, loss, o, t)), per.sum(), rtol=1e-13)
    assert np.isclose(float(losses.metric_sum(LOSS_OPS, loss, o, t)), metric.sum(), rtol=1e-13)


def test_huber_is_torchs_huber_and_smooth_l1_at_their_defaults():
    o, t = torch.randn(64, 3, dtype=torch.float64) * 2, torch.randn(64, 3, dtype=torch.float64)
    got = LOSS_OPS.huber(o, t)
    assert torch.equal(got, F.huber_loss(o, t, reduction="none"))
    assert torch.equal(got, F.smooth_l1_loss(o, t, reduction="none"))
