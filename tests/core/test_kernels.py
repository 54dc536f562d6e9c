"""The kernel calibration (dualtrain.core.kernels): its statistics tell a kernel that rounds its
float32 result to nearest from one that truncates it (TensorFlow's Eigen bf16 MatMul on a CPU
without AVX-512), from the numbers alone; here with NumPy stand-ins for a backend's product."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import kernels


def _product(mode: str):
    def product(kind: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
        out = kernels.exact(kind, a, b).astype(np.float32)  # float32 accumulation, then:
        return kernels.round_to(out, dtype, mode).astype(np.float64)

    return product


@pytest.mark.parametrize("dtype", kernels.DTYPES)
def test_a_kernel_that_rounds_to_nearest_has_no_directed_error(dtype):
    cal = kernels.calibrate(_product("nearest"), dtype)
    for kind, e in cal.items():
        assert e.rounding == "to nearest", kind
        assert abs(e.directed) < 0.02, (kind, e)  # random signs: no coherent shrink
        assert 0.3 < e.rms < 0.5, (kind, e)  # uniform relative rounding: ~0.42 u


def test_a_kernel_that_truncates_shrinks_every_product():
    cal = kernels.calibrate(_product("toward zero"), "bf16")
    for kind, e in cal.items():
        assert e.rounding == "toward zero", kind
        assert -0.8 < e.directed < -0.65, (kind, e)  # the measured Eigen bf16 MatMul: -0.73 u
        assert e.nearest_share < 0.6


def test_the_problems_are_exact_in_the_dtype_and_fixed():
    for dtype in kernels.DTYPES:
        for kind in kernels.KINDS:
            a, b = kernels.problem(kind, dtype)
            assert np.array_equal(kernels.round_to(a, dtype), a)
            assert np.array_equal(kernels.round_to(b, dtype), b)
            a2, _ = kernels.problem(kind, dtype)
            assert np.array_equal(a, a2)
    a, b = kernels.problem("conv", "bf16")  # the convolution's exact result, against a loop
    out = kernels.exact("conv", a, b)
    n, o, i, j = 1, 3, 5, 7
    k = b.shape[-1]
    want = np.sum(a[n, :, i : i + k, j : j + k].astype(np.float64) * b[o].astype(np.float64))
    assert out[n, o, i, j] == pytest.approx(want, rel=1e-14)


def test_round_to_bf16_is_round_to_nearest_even():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7 + 2**-9, -(1 + 2**-8)], np.float32)
    assert list(kernels.round_to(x, "bf16")) == [1.0, 1 + 2**-6, 1 + 2**-7, -1.0]
    assert list(kernels.round_to(x, "bf16", "toward zero")) == [1.0, 1 + 2**-7, 1 + 2**-7, -1.0]


def test_directed_reads_a_runs_calibration():
    summary = {"kernels": {"measured": {"bf16": {"matmul": {"directed": -0.73}}}}}
    assert kernels.directed(summary, "bf16") == {"matmul": -0.73}
    assert kernels.directed(summary, "fp16") is None
    assert kernels.directed({}, "bf16") is None
