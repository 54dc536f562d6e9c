"""Keras's float64 MultiHeadAttention is float32-accurate (its TensorFlow dot_product_attention
casts the scale 1/sqrt(key_dim), a Python float, through float32); dualtrain.backends.tf.exact
scales by the float64 constant in fp64 processes (dualtrain.core.limits 'attention_scale'):
exact against a NumPy reference of the same layer, Keras's own op in every other dtype, and
where the model used it recorded for the report."""

import json

import numpy as np

from testkit.tf_runs import run_python

#: one MultiHeadAttention (2 heads of 3: the scale 1/sqrt(3) is no float32) on fixed weights and
#: input, and its NumPy reference
LAYER = """
import numpy as np, keras
keras.config.set_dtype_policy("float64")
rng = np.random.default_rng(0)
x = rng.normal(size=(2, 5, 8))
mha = keras.layers.MultiHeadAttention(2, 3, name="attn")
mha(x, x)
mha.set_weights([rng.normal(size=w.shape) for w in mha.get_weights()])
"""


def _reference(x, weights):
    qk, qb, kk, kb, vk, vb, ok, ob = weights
    q, k, v = (np.einsum("btd,dhe->bthe", x, w) + b for w, b in ((qk, qb), (kk, kb), (vk, vb)))
    s = np.einsum("bthe,bshe->bhts", q, k) / np.sqrt(3.0)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bthe,hed->btd", np.einsum("bhts,bshe->bthe", p, v), ok) + ob


def _run(code: str) -> dict:
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_keras_attention_is_float32_accurate_and_exact_once_substituted():
    # each in a process of its own: Keras's own op, then with dualtrain's substitution
    out = "print(json.dumps({'x': x.tolist(), 'w': [w.tolist() for w in mha.get_weights()], "
    out += "'y': np.asarray(mha(x, x)).tolist()}))"
    own = _run("import json\n" + LAYER + out)
    exact = _run(
        "import json\nfrom dualtrain.backends.tf import exact\nexact.install()\n"
        + LAYER
        + out.replace("}))", ", 'report': exact.report()}))")
    )
    ref = _reference(np.array(own["x"]), [np.array(w) for w in own["w"]])
    top = float(np.max(np.abs(ref)))  # relative: float64 rounding is ~1e-16 of the largest
    err_own = float(np.max(np.abs(np.array(own["y"]) - ref))) / top
    err_exact = float(np.max(np.abs(np.array(exact["y"]) - ref))) / top
    print(err_own, err_exact)
    assert err_own > 1e-10 and err_exact < 1e-14
    (limit,) = [e for e in exact["report"] if e["op"] == "attention_scale"]
    assert limit["where"] == ["attn (3 wide)"] and limit["error"] > 1e-10


def test_other_dtypes_run_keras_own_attention():
    code = (
        "import json, numpy as np, keras\nfrom dualtrain.backends.tf import exact\n"
        "x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype('float32')\n"
        "mha = keras.layers.MultiHeadAttention(2, 3); a = np.asarray(mha(x, x))\n"
        "exact.install(); b = np.asarray(mha(x, x))\n"
        "print(json.dumps({'same': bool(np.array_equal(a, b)), 'report': exact.report()}))"
    )
    got = _run(code)
    assert got["same"] and got["report"] == []
