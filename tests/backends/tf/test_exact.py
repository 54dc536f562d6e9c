"""Keras's float64 ops that are only float32-accurate (dualtrain.core.limits), run exactly by
dualtrain.backends.tf.exact in fp64 processes: exact in float64 against math.erf and the
definition, the framework's own op bit for bit in every other dtype, and where the model used
them recorded for the report. The survey: of Keras's activations a pair can use, only these two
are off by more than float64 rounding here."""

import json
import math

import numpy as np
import pytest

from testkit.tf_runs import run_python

X = np.linspace(-6.0, 6.0, 1201)
#: float64 rounding of these functions on |x| <= 6 is a few 1e-16; float32-accurate is 1e-9
ROUNDING = 1e-14


def _gelu(x: float, tanh: bool) -> float:
    if tanh:
        return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


#: the exact float64 reference of each activation, as its Keras documentation defines it
REFERENCES = {
    "gelu": lambda x: np.array([_gelu(v, False) for v in x]),
    "elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "selu": lambda x: (
        1.0507009873554804934193349852946
        * np.where(x > 0, x, 1.6732632423543772848170429916717 * np.expm1(x))
    ),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "softsign": lambda x: x / (1.0 + np.abs(x)),
    "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.2 * x),
}


def test_only_gelu_and_leaky_relu_are_float32_accurate_in_float64():
    # in a process of its own: the survey of Keras's own ops, before anything is substituted
    code = (
        "import json, numpy as np, keras; x = np.linspace(-6, 6, 1201); "
        "print(json.dumps({n: np.asarray(getattr(keras.activations, n)(x)).tolist() "
        f"for n in {sorted(REFERENCES)!r}}}))"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = {n: float(np.max(np.abs(np.array(got[n]) - REFERENCES[n](X)))) for n in REFERENCES}
    print(errors)
    off = {n for n, e in errors.items() if e > ROUNDING}
    assert off == {"gelu", "leaky_relu"}, errors
    assert all(errors[n] > 1e-10 for n in off)  # float32-accurate, not a last-bit difference


@pytest.fixture(scope="module")
def exact():
    from dualtrain.backends.tf import exact

    exact.install()
    return exact


def test_installed_ops_are_exact_in_float64(exact):
    import keras
    import tensorflow as tf

    x = tf.constant(X, tf.float64)
    for tanh in (False, True):
        got = np.asarray(keras.activations.gelu(x, approximate=tanh))
        ref = np.array([_gelu(v, tanh) for v in X])
        assert np.max(np.abs(got - ref)) < ROUNDING, tanh
    for layer, slope in (
        (keras.layers.LeakyReLU(0.01, dtype="float64"), 0.01),
        (keras.layers.ReLU(negative_slope=0.1, dtype="float64"), 0.1),
    ):
        got = np.asarray(layer(x))
        assert np.array_equal(got, np.where(X > 0, X, X * slope)), slope
    assert exact.measured_error("gelu") > 1e-10 and exact.measured_error("leaky_relu") > 1e-10


def test_other_dtypes_run_the_frameworks_own_op(exact):
    import keras
    import tensorflow as tf

    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        x = tf.constant(X, dtype)
        for tanh in (False, True):
            own = exact.ORIGINAL["gelu"](x, approximate=tanh)
            assert np.array_equal(np.asarray(keras.activations.gelu(x, approximate=tanh)), own)
        own = exact.ORIGINAL["leaky_relu"](x, alpha=0.2)
        assert np.array_equal(np.asarray(keras.activations.leaky_relu(x)), own)


def test_the_layers_that_used_them_are_recorded(exact):
    import keras

    keras.config.set_dtype_policy("float64")
    try:
        inp = keras.Input((4,))
        x = keras.layers.Dense(6, activation="gelu", name="fc_gelu")(inp)
        x = keras.layers.LeakyReLU(0.01, name="leaky")(x)
        net = keras.Model(inp, keras.layers.Dense(2, name="head")(x), name="net")
    finally:
        keras.config.set_dtype_policy("float32")
    net(np.zeros((2, 4)))
    report = {e["op"]: e for e in exact.report()}
    assert "net/fc_gelu (6 wide)" in report["gelu"]["where"]
    assert "net/leaky (6 wide)" in report["leaky_relu"]["where"]
    assert report["gelu"]["error"] > 1e-10
