"""torch's loss kernels (backends/torch/ops.py) against each loss's NumPy reference, in float64."""

import numpy as np
import pytest
import torch

from dualtrain.backends.torch.ops import LOSS_OPS
from dualtrain.core import losses
from dualtrain.core.losses import LOSSES, reference
from dualtrain.spec import Loss


@pytest.mark.parametrize("loss", list(Loss))
def test_torch_kernels_compute_the_reference(loss):
    rng = np.random.default_rng(1)
    out = rng.standard_normal((32, 4)) * 3
    if LOSSES[loss].labels:
        y = rng.integers(0, 4, 32)
    else:
        lo, hi = LOSSES[loss].target_range or (-4.0, 4.0)
        y = rng.uniform(lo, hi, (32, 4))
    per, metric = reference(loss, out, y)
    o, t = torch.from_numpy(out), torch.from_numpy(y)
    assert np.isclose(float(losses.loss_sum(LOSS_OPS, loss, o, t)), per.sum(), rtol=1e-13)
    assert np.isclose(float(losses.metric_sum(LOSS_OPS, loss, o, t)), metric.sum(), rtol=1e-13)
