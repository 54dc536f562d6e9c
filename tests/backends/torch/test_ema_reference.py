"""dualtrain.core.ema (on the update rules' NumPy namespace, as the TF backend computes it, and
as the torch engine's ``add_(alpha=)``) against torch.optim.swa_utils.AveragedModel with
get_ema_multi_avg_fn: torch stays the reference. The same sequence of weights, the schedule of
train.ema (first update copies, copies until ``start``, then every ``every`` steps)."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import ema
from dualtrain.core.ops import NUMPY
from dualtrain.spec import EmaSpec

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "spec", [EmaSpec(decay=0.9), EmaSpec(decay=0.99, every=3, start=4)], ids=["every", "start"]
)
def test_the_average_is_averaged_models(dtype, spec):
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    rng = np.random.default_rng(0)
    w = [rng.standard_normal((7, 5)).astype(dtype)]
    module = torch.nn.Linear(5, 7, bias=False).to(getattr(torch, dtype))
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(w[0]))
    reference = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(spec.decay))
    ours = w[0].copy()  # the loop copies the initial weights before step 1
    engine_side = torch.from_numpy(w[0].copy())
    for step in range(1, 30):
        new = (w[-1] + 0.1 * rng.standard_normal(w[-1].shape)).astype(dtype)
        w.append(new)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(new))
        todo = ema.action(spec, step)
        if todo is None:
            continue
        if todo == ema.COPY:  # until start: AveragedModel's first call, which copies
            reference.n_averaged.zero_()
        reference.update_parameters(module)
        current = torch.from_numpy(new)
        if todo == ema.COPY:
            ours, engine_side = new.copy(), current.clone()
        else:
            ours = ema.update(NUMPY, ours, new, spec.decay)
            engine_side.add_(current - engine_side, alpha=1.0 - spec.decay)
        ref = reference.module.weight.detach().numpy()
        eps = np.finfo(dtype).eps * np.abs(ref).max()
        assert np.abs(ours - ref).max() <= 2 * eps, step  # lerp rounds once, we twice
        # the torch engine's add_(alpha=) and the rule on the NumPy namespace (the TF backend's):
        # bit for bit where torch fuses the float32 multiply-add (test_update_rules_torch.py), half
        # an ulp apart in float64
        assert np.abs(ours - engine_side.numpy()).max() <= eps, step
