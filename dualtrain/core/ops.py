"""The array namespace the update rules compute with (:class:`Ops`; :class:`NormOps`, the part the
global gradient norm needs), and its NumPy instance (:data:`NUMPY`).

Every caller of dualtrain.core.update_rules hands in one of these: the TF backend its namespace of
tensors and variables (dualtrain/backends/tf/ops.py), the torch backend the norm only
(dualtrain/backends/torch/ops.py), and the one-step probes' exact reference the float64 NumPy
namespace here (dualtrain/core/optim_ref.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class NormOps:
    """What the global gradient norm needs (the torch backend supplies only this)."""

    norm: Callable[[Any], Any]
    """x -> the L2 norm of all of x's elements, a scalar of x's dtype."""
    stack: Callable[[list[Any]], Any]
    """scalars -> the vector of them."""


@dataclass(frozen=True)
class Ops(NormOps):
    """The arithmetic a backend supplies for the update rules (arrays of the parameter dtype)."""

    fma: Callable[[Any, Any, Any], Any]
    """(a, alpha, b) -> ``a + alpha * b`` as torch's ``a.add(b, alpha=alpha)`` computes it on CPU:
    one rounding in float32 (alpha rounded to float32 first); see the TF and NumPy namespaces for
    the float64 trick that gets there, and for float64 arrays. alpha: a Python number or a float64
    scalar."""
    sqrt: Callable[[Any], Any]
    where: Callable[[Any, Any, Any], Any]
    """(condition, a, b) -> a where condition, else b (a scalar condition picks a whole array)."""
    minimum: Callable[[Any, Any], Any]
    maximum: Callable[[Any, Any], Any]
    """Elementwise, NaN-propagating (torch.maximum)."""
    equal: Callable[[Any, Any], Any]
    logical_and: Callable[[Any, Any], Any]
    zeros_like: Callable[[Any], Any]
    cast: Callable[[Any, Any], Any]
    """(x, like) -> x in like's dtype, rounded once: x is a Python number (taken as the double it
    is) or a float64 scalar."""
    float64: Callable[[Any], Any]
    """x -> a float64 scalar: a Python number (directly, not through float32) or an integer
    scalar."""
    power: Callable[[Any, Any], Any]
    """(base, exponent), float64 scalars -> base ** exponent in float64 (C's pow)."""


# ---- the NumPy namespace -------------------------------------------------------------------------


def _np_fma(a: Any, alpha: Any, b: Any) -> np.ndarray:
    """torch's ``a.add(b, alpha=alpha)`` in NumPy. float32: the float64 product of two float32
    values is exact, so one float64 add and one rounding to float32 give the fused result (the TF
    backend's trick, dualtrain/backends/tf/ops.py). float64: ``a + alpha * b``, rounded twice (no
    wider type to fuse in; torch's CPU kernel fuses: one fp64 ulp at most)."""
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a + np.float64(alpha) * b
    f64 = np.float64
    alpha32 = f64(np.float32(alpha))
    return (a.astype(f64) + alpha32 * np.asarray(b, f64)).astype(a.dtype)


def _np_norm(x: Any) -> Any:
    x = np.asarray(x)
    return np.sqrt(np.sum(x * x))


NUMPY = Ops(
    norm=_np_norm,
    stack=np.stack,
    fma=_np_fma,
    sqrt=np.sqrt,
    where=np.where,
    minimum=np.minimum,
    maximum=np.maximum,
    equal=np.equal,
    logical_and=np.logical_and,
    zeros_like=np.zeros_like,
    cast=lambda x, like: np.asarray(x, np.asarray(like).dtype)[()],
    float64=np.float64,
    power=np.power,
)
"""The rules on NumPy arrays, in the arrays' dtype (float64 for the exact reference; float32 follows
torch's float32 rounding where the rule says so, fma and casts)."""
