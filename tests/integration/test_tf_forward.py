"""Forward parity (canonical weights into both backends) and the canonical <-> Keras round trip."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dualtrain.core.weights import init_weights, save_weights
from dualtrain.spec import Backend, ModelSpec
from testkit.tf_runs import run_python, write_spec

N_IMAGES = 256


def _forward(module: str, spec_path, weights_path, out_path) -> np.ndarray:
    backend = Backend.TORCH if ".torch." in module else Backend.TF
    args = ("forward", str(spec_path), str(weights_path), str(N_IMAGES), str(out_path))
    proc = run_python("-m", module, *args, backend=backend)
    assert proc.returncode == 0, f"{module} forward failed:\n{proc.stdout}\n{proc.stderr}"
    with np.load(out_path) as z:
        return z["logits"]


def test_forward_parity_with_torch_cnn(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", {"model": {"preset": "cnn"}})
    weights = tmp_path / "w.npz"
    save_weights(weights, init_weights(ModelSpec(preset="cnn"), 0))
    # the TF forward tool writes float32 logits that vary with the image
    tf_logits = _forward("dualtrain.backends.tf.tools", spec, weights, tmp_path / "tf.npz")
    assert tf_logits.shape == (N_IMAGES, 10) and tf_logits.dtype == np.float32
    assert np.all(np.isfinite(tf_logits)) and np.ptp(tf_logits) > 0
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    torch_logits = _forward("dualtrain.backends.torch.tools", spec, weights, tmp_path / "torch.npz")
    assert tf_logits.shape == torch_logits.shape == (N_IMAGES, 10)
    diff = float(np.max(np.abs(tf_logits - torch_logits)))
    assert diff <= 1e-5, f"max |logits diff| = {diff:.3g}"


def test_forward_parity_with_torch_residual_batchnorm(tmp_path):
    # configs/mnist_resnet_bn.yaml in evaluation: residual adds, strided and 1x1 shortcut convs, and
    # batchnorm with non-trivial weights and running statistics (drawn here, not the 1/0 start).
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    from dualtrain.spec import load_spec

    cfg = Path(__file__).resolve().parents[2] / "configs" / "mnist_resnet_bn.yaml"
    model = load_spec(str(cfg)).model
    w = init_weights(model, 0)
    rng = np.random.default_rng(1)
    for name in [n for n in w if n.endswith(".running_var")]:
        prefix, shape = name.rsplit(".", 1)[0], w[name].shape
        w[name] = rng.uniform(0.05, 0.5, shape).astype(np.float32)
        w[prefix + ".running_mean"] = rng.normal(0, 0.1, shape).astype(np.float32)
        w[prefix + ".weight"] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        w[prefix + ".bias"] = rng.normal(0, 0.3, shape).astype(np.float32)
    weights = tmp_path / "w.npz"
    save_weights(weights, w)
    tf_logits = _forward("dualtrain.backends.tf.tools", cfg, weights, tmp_path / "tf.npz")
    torch_logits = _forward("dualtrain.backends.torch.tools", cfg, weights, tmp_path / "torch.npz")
    diff = float(np.max(np.abs(tf_logits - torch_logits)))
    assert torch_logits.std(axis=0).min() > 0.01, "the features must vary with the image"
    print(f"residual+batchnorm forward: max |logits diff| {diff:.3g}")
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3g}"


ROUND_TRIP = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
from dualtrain.spec import ModelSpec, LayerSpec, LayerType, Padding
from dualtrain.core.weights import init_weights
from dualtrain.backends.tf.model import build_model, export_canonical, load_canonical
from dualtrain.core.model import keras_layouts

custom = ModelSpec(layers=(
    LayerSpec(type=LayerType.CONV2D, filters=3, kernel_size=5, stride=2),
    LayerSpec(type=LayerType.RELU),
    LayerSpec(type=LayerType.CONV2D, filters=4, kernel_size=3, padding=Padding.SAME),
    LayerSpec(type=LayerType.MAXPOOL2D, pool_size=3, stride=2),
    LayerSpec(type=LayerType.FLATTEN),
    LayerSpec(type=LayerType.DENSE, units=10)))
for ms in (ModelSpec(preset="mlp"), ModelSpec(preset="cnn"), custom):
    w = init_weights(ms, 7)
    model, named = build_model(ms)
    load_canonical(named, w, keras_layouts(ms))
    back = export_canonical(named, keras_layouts(ms))
    assert list(back) == list(w), (list(back), list(w))
    for k in w:
        assert back[k].dtype == np.float32 and back[k].shape == w[k].shape, k
        assert np.array_equal(back[k], w[k]), k
    print("ok", ms.preset or "custom", len(w))
"""

FLATTEN_ORDER = r"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
from dualtrain.spec import ModelSpec, LayerSpec, LayerType, Padding
from dualtrain.core.weights import init_weights
from dualtrain.core.data.transforms import normalize
from dualtrain.backends.tf.model import build_model, load_canonical, to_nhwc
from dualtrain.core.model import keras_layouts

# conv (2 channels) -> flatten -> dense: compute torch's answer by hand in NumPy (NCHW, C,H,W
# flatten).
ms = ModelSpec(layers=(LayerSpec(type=LayerType.CONV2D, filters=2, kernel_size=27),
                       LayerSpec(type=LayerType.FLATTEN),
                       LayerSpec(type=LayerType.DENSE, units=10)))
w = init_weights(ms, 3)
rng = np.random.default_rng(0)
imgs = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
x = normalize(imgs).astype(np.float64)                       # N,1,28,28
k, b = w["0.weight"].astype(np.float64), w["0.bias"].astype(np.float64)   # 2,1,27,27
conv = np.zeros((5, 2, 2, 2))
for o in range(2):
    for i in range(2):
        for j in range(2):
            conv[:, o, i, j] = (x[:, 0, i:i + 27, j:j + 27] * k[o, 0]).sum(axis=(1, 2)) + b[o]
flat = conv.reshape(5, -1)                                    # C,H,W order
ref = flat @ w["2.weight"].astype(np.float64).T + w["2.bias"]
model, named = build_model(ms)
load_canonical(named, w, keras_layouts(ms))
got = np.asarray(model(to_nhwc(normalize(imgs)), training=False))
err = np.abs(got - ref).max()
assert err < 1e-5, err
print("ok", err)
"""


def test_canonical_keras_round_trip_is_exact():
    proc = run_python("-c", ROUND_TRIP)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok") == 3


def test_conv_flatten_uses_torch_chw_order():
    proc = run_python("-c", FLATTEN_ORDER)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout
