"""What a backend's low-precision kernels do on this CPU: a calibration defined once (no framework).

The same spec can run on kernels that round differently on another CPU, and nothing in either
backend is wrong. Measured (issue 30): on a CPU without AVX-512, TensorFlow's oneDNN refuses bf16
and its Eigen MatMul accumulates in float32 and converts the result to bfloat16 by **truncation**
(every element is rounded toward zero, on average 0.73 u smaller in magnitude), where oneDNN and
torch round to nearest. A loss is a mean over the batch: errors that round to nearest average out
over it, a directed error does not, so the tf bf16 path's one-step loss error there is 7.5x torch's
on the MNIST MLP. A cross bound that reads only the other backend's error takes that for a defect of
the tf path (a false FAIL) and, the other way round, lends torch tf's larger error (a bf16 loss
defect on torch passed).

So each run measures its own kernels, at fixed shapes, on the machine it runs on, before it trains:
each kind of product (:data:`KINDS`: a matrix product, a convolution) on inputs exactly
representable in the precision, against the exact float64 product of the same inputs. A backend
supplies only the arithmetic (its framework's product in that dtype); the problems, the exact
results and the statistics live here:

* ``directed``: the least-squares scale error of the product, ``<out - exact, exact> / <exact,
  exact>``, in units of the precision's u: what the kernel does to every element *coherently* (-0.73
  u for a kernel that truncates, 0.00 u for one that rounds to nearest);
* ``rms``: the norm-wise error around it, ``||out - (1 + directed) exact|| / ||exact||`` in u (about
  0.42 u for round-to-nearest output);
* ``rounding``: which rounding of the exact product the output is (``nearest``, ``toward zero``, or
  ``other``), from the share of elements equal to each.

The one-step loss check (dualtrain.parity.checks.probes) uses ``directed``: at every probe the fp64
run recorded the loss's first-order sensitivity to scaling every product's output (``S_k``, per
kind; dualtrain.backends.torch.condition), so a kernel whose directed error is ``d`` moves the
step's loss by ``d S_k`` on top of what round-to-nearest does. The other backend's error is
translated onto this backend's kernels by the difference of the two directed errors before the two
are compared; the calibration is measured on the framework's primitive, never on the path it judges,
so a defect in a backend's path cannot widen its own bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: The kinds of product a model's layers run: dense layers (``matmul``) and convolutions (``conv``).
KINDS = ("matmul", "conv")
#: The precisions whose kernels are calibrated (fp32 and fp64 products round at the accumulation,
#: the same way on every kernel up to its summation order).
DTYPES = ("bf16", "fp16")
U = {"bf16": 2.0**-8, "fp16": 2.0**-11}

#: Fixed problem sizes (a dense layer of a small MLP on a batch of 64; a 3x3 convolution on 16
#: channels), large enough for stable statistics (8,192 and 6,272 outputs) and cheap (a few ms).
MATMUL = (64, 512, 128)  # (M, K, N): a (M, K) @ b (K, N)
CONV = (4, 16, 16, 16, 32, 3)  # (N, C, H, W, O, k): NCHW input, OIHW kernel, stride 1, valid
SEED = 20260

#: A backend's product: (kind, a, b, dtype) -> the framework's result in ``dtype``, as float64.
#: ``a`` and ``b`` are float32 arrays exactly representable in ``dtype`` (matmul: a (M, K) and
#: b (K, N); conv: a (N, C, H, W) and b (O, C, k, k), valid, stride 1, NCHW out).
Product = Callable[[str, np.ndarray, np.ndarray, str], np.ndarray]


def round_to(x: np.ndarray, dtype: str, mode: str = "nearest") -> np.ndarray:
    """float32 ``x`` rounded to ``dtype`` (``nearest`` even, or ``toward zero``), as float32."""
    x = np.asarray(x, np.float32)
    if dtype == "fp16":
        if mode != "nearest":
            raise ValueError("fp16: round to nearest only")
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    if mode == "nearest":
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).astype(np.uint32).view(np.float32)


def problem(kind: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The inputs of ``kind`` in ``dtype`` (float32 arrays whose values ``dtype`` holds exactly)."""
    rng = np.random.default_rng(SEED + KINDS.index(kind))
    if kind == "matmul":
        m, k, n = MATMUL
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, n)) / math.sqrt(k)
    else:
        n_, c, h, w, o, ks = CONV
        a = rng.standard_normal((n_, c, h, w))
        b = rng.standard_normal((o, c, ks, ks)) / math.sqrt(c * ks * ks)
    return round_to(a.astype(np.float32), dtype), round_to(b.astype(np.float32), dtype)


def exact(kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The float64 product (exact to float64 rounding: float32 products, sums of <= 512 terms)."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if kind == "matmul":
        return a64 @ b64
    k = b64.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(a64, (k, k), axis=(2, 3))  # N, C, H', W', k, k
    return np.einsum("nchwij,ocij->nohw", win, b64)


@dataclass(frozen=True)
class KernelError:
    """One kernel's calibration (relative errors in units of the precision's u)."""

    directed: float
    rms: float
    rounding: str
    nearest_share: float
    """The share of outputs equal to the exact product rounded to nearest."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(kind: str, dtype: str, out: np.ndarray) -> KernelError:
    """The statistics of a backend's ``out`` for :func:`problem` (``kind``, ``dtype``)."""
    ref = exact(kind, *problem(kind, dtype))
    out = np.asarray(out, np.float64).reshape(ref.shape)
    u = U[dtype]
    err = out - ref
    directed = float(np.sum(err * ref) / np.sum(ref * ref))
    rms = float(np.linalg.norm(out - (1.0 + directed) * ref) / np.linalg.norm(ref))
    ref32 = ref.astype(np.float32)
    nearest = float(np.mean(out == round_to(ref32, dtype)))
    toward_zero = (
        float(np.mean(out == round_to(ref32, dtype, "toward zero"))) if dtype == "bf16" else 0
    )
    rounding = "to nearest" if nearest >= 0.9 else "toward zero" if toward_zero >= 0.9 else "other"
    return KernelError(directed / u, rms / u, rounding, nearest)


def calibrate(product: Product, dtype: str) -> dict[str, KernelError]:
    """Every kind of product of one backend in ``dtype``, measured on this machine."""
    return {
        kind: measure(kind, dtype, product(kind, *problem(kind, dtype), dtype)) for kind in KINDS
    }


#: CPU feature flags (/proc/cpuinfo) of each dtype's own arithmetic instructions (x86, Arm).
INSTRUCTIONS = {
    "bf16": ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16"),
    "fp16": ("avx512_fp16", "amx_fp16", "avx_ne_convert", "fphp", "asimdhp"),
}
#: ONEDNN_MAX_CPU_ISA values that still let oneDNN use each dtype's instructions (unset: all).
_ISA_CAPS = {
    "bf16": (
        "AVX2_VNNI_2",
        "AVX512_CORE_BF16",
        "AVX512_CORE_FP16",
        "AVX10_1_512",
        "AVX512_CORE_AMX",
        "AVX10_1_512_AMX",
        "AVX512_CORE_AMX_FP16",
        "AVX10_1_512_AMX_FP16",
        "ALL",
        "DEFAULT",
    ),
    "fp16": (
        "AVX2_VNNI_2",
        "AVX512_CORE_FP16",
        "AVX10_1_512",
        "AVX512_CORE_AMX_FP16",
        "AVX10_1_512_AMX_FP16",
        "ALL",
        "DEFAULT",
    ),
}


def has_instructions(flags: set[str], dtype: str) -> bool:
    """Whether this CPU has arithmetic instructions of its own for ``dtype``."""
    return any(f in flags for f in INSTRUCTIONS[dtype])


def isa_allows(dtype: str, environ: Any = None) -> bool:
    """Whether ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) leaves oneDNN ``dtype``'s instructions."""
    environ = os.environ if environ is None else environ
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip()
    return not cap or cap.upper() in _ISA_CAPS[dtype]


def static_facts(flags: set[str], onednn: Callable[[str], bool], fallback: str) -> dict[str, Any]:
    """Per dtype and kind: the implementation (oneDNN where the backend's ``onednn(dtype)`` says it
    hands that dtype's products to oneDNN, else its ``fallback``: ATen, Eigen) and whether the
    CPU's own instructions for the dtype run it (``flags``: the CPU's feature flags,
    dualtrain.records.envinfo); an emulated one says why."""
    out: dict[str, Any] = {}
    for dtype in DTYPES:
        on = onednn(dtype)
        native = on and has_instructions(flags, dtype) and isa_allows(dtype)
        why = "float32 arithmetic" if not on else f"no {dtype} instructions on this CPU"
        out[dtype] = {
            kind: {"implementation": "oneDNN" if on else fallback, "native": native}
            | ({} if native else {"why": why})
            for kind in KINDS
        }
    return out


def facts(
    static: dict[str, Any], product: Product | None, measure_dtypes: tuple[str, ...]
) -> dict[str, Any]:
    """A backend's kernel facts as summary.json ``kernels`` and ``dualtrain env`` hold them: the
    implementation per dtype and kind (``static``), and the calibration of ``measure_dtypes``
    (``measured``: dtype -> kind -> KernelError fields)."""
    measured = {}
    if product is not None:
        for dtype in measure_dtypes:
            if dtype in DTYPES:
                measured[dtype] = {k: e.as_dict() for k, e in calibrate(product, dtype).items()}
    return {"static": static, "measured": measured}


def for_run(dtype: str, static: dict[str, Any], product: Product) -> dict[str, Any]:
    """summary.json ``kernels`` of a run in ``dtype`` (a precision's value: fp32, bf16...): the
    static facts, and the calibration of the run's own dtype when it is a low precision."""
    return facts(static, product, (dtype,) if dtype in DTYPES else ())


def directed(summary: dict[str, Any], dtype: str) -> dict[str, float] | None:
    """The directed error (in u) per kind of a run's kernels from its summary.json, or None for a
    run without a calibration (made before it existed, or not in ``dtype``)."""
    cal = ((summary.get("kernels") or {}).get("measured") or {}).get(dtype)
    if not cal:
        return None
    try:
        return {k: float(cal[k]["directed"]) for k in KINDS if k in cal}
    except (KeyError, TypeError, ValueError):
        return None


def describe(facts: dict[str, Any], dtype: str, kind: str = "matmul") -> str:
    """One line for a backend's ``kind`` kernel in ``dtype``: which implementation, native or
    emulated, and (where measured) how it rounds."""
    static = ((facts.get("static") or {}).get(dtype) or {}).get(kind) or {}
    cal = ((facts.get("measured") or {}).get(dtype) or {}).get(kind)
    text = static.get("implementation", "unknown kernel")
    native = static.get("native")
    if native is not None:
        text += ", native" if native else f", emulated ({static.get('why', 'float32 arithmetic')})"
    if cal:
        text += (
            f"; rounds {cal['rounding']} "
            f"(directed {cal['directed']:+.2f} u, rms {cal['rms']:.2f} u)"
        )
    return text
