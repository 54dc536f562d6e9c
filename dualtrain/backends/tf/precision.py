"""The one place that maps the spec's precision to a Keras dtype policy."""

from __future__ import annotations

from dualtrain.spec import Precision

_POLICIES = {
    Precision.FP32: "float32",
    Precision.FP16: "mixed_float16",
    Precision.BF16: "mixed_bfloat16",
    Precision.FP64: "float64",
}


def policy_name(dtype: Precision) -> str:
    """fp16 -> mixed_float16, bf16 -> mixed_bfloat16 (variables stay float32), fp32 -> float32,
    fp64 -> float64 (variables, activations and everything downstream in float64)."""
    return _POLICIES[Precision(dtype)]
