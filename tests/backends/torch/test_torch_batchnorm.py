"""dualtrain's BatchNorm module (dualtrain.core.batchnorm on torch tensors) against torch's own
nn.BatchNorm1d/2d, the reference: outputs, input and parameter gradients, running statistics after
several training steps, and evaluation, in float64 (to rounding) and float32."""

from __future__ import annotations

import pytest
import torch

from dualtrain.backends.torch.layers import BatchNorm


@pytest.mark.parametrize("shape", [(16, 5), (6, 3, 7, 7), (1, 4, 3, 3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_matches_torch_batchnorm(shape, dtype, tol):
    torch.manual_seed(0)
    c = shape[1]
    ours = BatchNorm(c, momentum=0.3, eps=1e-5, sync=False).to(dtype)
    ref = (torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d)(
        c, momentum=0.3, eps=1e-5
    ).to(dtype)
    with torch.no_grad():
        w, b = torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype)
        for m in (ours, ref):
            m.weight.copy_(w)
            m.bias.copy_(b)
    for step in range(3):
        x = (torch.randn(shape, dtype=dtype) * (step + 1) + step).requires_grad_(True)
        x_ref = x.detach().clone().requires_grad_(True)
        y, y_ref = ours(x), ref(x_ref)
        torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
        g = torch.randn(shape, dtype=dtype)
        (y * g).sum().backward()
        (y_ref * g).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=tol, atol=tol * c)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=tol, atol=tol * c)
    # running_var from the unbiased batch variance, torch's momentum
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=tol, atol=tol)
    assert set(ours.state_dict()) == set(ref.state_dict()) - {"num_batches_tracked"}
    ours.eval()
    ref.eval()
    x = torch.randn(shape, dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x), rtol=tol, atol=tol)


def test_autocast_keeps_statistics_in_float32():
    # Under bf16 autocast the statistics are computed in float32 and the output has the input's
    # dtype.
    bn = BatchNorm(3, momentum=0.1, eps=1e-5, sync=False)
    x = torch.randn(8, 3, 5, 5).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = bn(x)
    assert y.dtype == torch.bfloat16
    assert bn.running_mean.dtype == torch.float32
    torch.testing.assert_close(bn.running_mean, 0.1 * x.float().mean(dim=(0, 2, 3)))
