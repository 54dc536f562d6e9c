"""torch's low-precision products as the calibration sees them (dualtrain.core.kernels), and the
ce_low_precision mutant's arithmetic on the torch backend (tools/mutants/).

torch rounds its bf16 and fp16 products to nearest whether oneDNN or ATen computes them (with
oneDNN off, ATen accumulates in float32 and rounds once): the calibration must say so from the
numbers, and the static facts must name the implementation torch picks."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import kernels
from dualtrain.records.envinfo import cpu_flags

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("mkldnn", [True, False])
def test_torch_rounds_its_low_precision_products_to_nearest(mkldnn):
    from dualtrain.backends.torch import kernels as torch_kernels

    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = mkldnn
    try:
        static = torch_kernels.static_facts(cpu_flags())
        if not mkldnn:
            assert static["bf16"]["matmul"]["implementation"] == "ATen"
            assert static["bf16"]["matmul"]["native"] is False
        for dtype in kernels.DTYPES:
            cal = kernels.calibrate(torch_kernels.product, dtype)
            for kind, e in cal.items():
                assert e.rounding == "to nearest" and abs(e.directed) < 0.05, (dtype, kind, e)
    finally:
        torch.backends.mkldnn.enabled = before


def test_the_bf16_loss_mutant_is_its_own_arithmetic():
    import types

    from dualtrain.backends.torch.forward import ForwardPass
    from dualtrain.core.losses import reference
    from dualtrain.spec import Loss, load_spec
    from tools.mutants import precision as mutants

    spec = load_spec(None, ["precision.dtype=bf16"])
    rng = np.random.default_rng(1)
    logits = torch.from_numpy((rng.standard_normal((64, 10)) * 3).astype(np.float32)).bfloat16()
    y = torch.from_numpy(rng.integers(0, 10, 64))
    per = reference(Loss.CROSS_ENTROPY, logits.float().numpy(), y.numpy())[0]
    original = ForwardPass.loss_sum
    try:
        mutants.torch_ce_low_precision("bf16", None)
        state = types.SimpleNamespace(spec=spec, dtype=torch.float32, loss=Loss.CROSS_ENTROPY)
        got = float(ForwardPass.loss_sum(types.SimpleNamespace(state=state), logits, y))
    finally:
        ForwardPass.loss_sum = original
    own = torch.nn.functional.cross_entropy(logits.float(), y, reduction="none").numpy()
    assert got == mutants.ce_low_sum(own)  # the backend's own float32 per-sample losses
    assert abs(got - per.sum()) > 1e-3 * per.sum()  # the mutant is a real error here
