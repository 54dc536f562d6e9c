"""TensorFlow's low-precision products as the calibration sees them (dualtrain.core.kernels), and
the ce_low_precision mutant's arithmetic on the tf backend (tools/mutants/), in one process.

Without oneDNN (TF_ENABLE_ONEDNN_OPTS=0, as on every CPU without AVX-512 for bf16) TensorFlow's
Eigen MatMul truncates its float32 result to bfloat16: the calibration must say so from the numbers
(directed about -0.73 u, "toward zero") and the static facts must name Eigen, on any CPU. Its
convolution and its fp16 products round to nearest."""

from __future__ import annotations

import os

from testkit.tf_runs import run_python

SCRIPT = r"""
import numpy as np
from dualtrain.backends.tf import kernels as tf_kernels
from dualtrain.core import kernels
from dualtrain.records.envinfo import cpu_flags

static = tf_kernels.static_facts(cpu_flags())
assert static["bf16"]["matmul"]["implementation"] == "Eigen", static
assert static["bf16"]["matmul"]["native"] is False, static
bf16 = kernels.calibrate(tf_kernels.product, "bf16")
assert bf16["matmul"].rounding == "toward zero", bf16
assert -0.8 < bf16["matmul"].directed < -0.65, bf16
assert bf16["conv"].rounding == "to nearest", bf16
fp16 = kernels.calibrate(tf_kernels.product, "fp16")
assert all(e.rounding == "to nearest" and abs(e.directed) < 0.05 for e in fp16.values()), fp16
print("ok kernels")

# the ce_low_precision mutant: the same arithmetic as tools.mutants.ce_low_sum, traced as a step is
import types
import tensorflow as tf
from dualtrain.core.losses import reference
from dualtrain.spec import Loss, load_spec
from tools.mutants import patching, precision as mutants

spec = load_spec("configs/mnist_mlp.yaml", ["precision.dtype=bf16"])
rng = np.random.default_rng(1)
logits = (rng.standard_normal((64, 10)) * 3).astype(np.float32)
y = rng.integers(0, 10, 64)
per = reference(Loss.CROSS_ENTROPY, logits, y)[0].astype(np.float32)
mutants.tf_ce_low_precision("bf16", None)
cls = patching.tf_forward()
state = types.SimpleNamespace(spec=spec, dtype=tf.float32, loss=Loss.CROSS_ENTROPY)
step = tf.function(lambda z, t: cls.loss_sum(types.SimpleNamespace(state=state), z, t))
got = float(step(tf.constant(logits, tf.bfloat16), tf.constant(y, tf.int32)))
z = tf.cast(tf.constant(logits, tf.bfloat16), tf.float32)
own = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.constant(y, tf.int32), logits=z)
want = mutants.ce_low_sum(own.numpy())  # the backend's own float32 per-sample losses
assert got == want, (got, want)
assert abs(want - per.sum()) > 1e-3 * per.sum()  # the mutant is a real error here
print("ok mutant")
"""


def test_eigen_truncates_bf16_products_and_the_mutant_is_its_own_arithmetic():
    env_before = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    try:
        res = run_python("-c", SCRIPT)
    finally:
        if env_before is None:
            os.environ.pop("TF_ENABLE_ONEDNN_OPTS")
        else:
            os.environ["TF_ENABLE_ONEDNN_OPTS"] = env_before
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "ok kernels" in res.stdout and "ok mutant" in res.stdout
