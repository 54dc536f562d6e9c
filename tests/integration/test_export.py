"""dualtrain export: the trained model in torch's and Keras's own form, loaded without dualtrain
(the loader runs in a fresh interpreter where ``import dualtrain`` fails), gives the run's
logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dualtrain.core.data.dataset import open_data
from dualtrain.core.data.splits import TEST
from dualtrain.spec import load_spec
from testkit.cli import ROOT, require, run_cli

require("torch", "tensorflow")

N = 256
# conv without bias + batchnorm (2d), a residual block with a strided 1x1 shortcut, dropout, gelu,
# avgpool, flatten (C,H,W order), dense + batchnorm (1d)
LAYERS = (
    "[{type: conv2d, filters: 8, kernel_size: 3, padding: 1, bias: false}, {type: batchnorm}, "
    "{type: relu}, {type: residual, body: [{type: conv2d, filters: 12, kernel_size: 3, stride: 2, "
    "padding: 1}, {type: gelu}], shortcut: [{type: conv2d, filters: 12, kernel_size: 1, "
    "stride: 2}]}, {type: avgpool2d, pool_size: 2}, {type: dropout, rate: 0.3}, {type: flatten}, "
    "{type: dense, units: 32}, {type: batchnorm, sync: true}, {type: tanh}, "
    "{type: dense, units: 16}, {type: layernorm}, {type: gelu, approximate: tanh}, "
    "{type: dense, units: 10}]"
)

# tokens: patches, position, pre-LN attention (causal) and MLP blocks, the first token; exported
# as torch's nn.MultiheadAttention and Keras's MultiHeadAttention, EinsumDense, Cropping1D
TOKENS = (
    "[{type: patches, size: 7, dim: 16}, {type: position}, {type: residual, body: [{type: "
    "layernorm}, {type: attention, heads: 4, causal: true}, {type: dropout, rate: 0.1}]}, "
    "{type: residual, body: [{type: layernorm}, {type: dense, units: 32}, {type: gelu}, "
    "{type: dense, units: 16}]}, {type: layernorm}, {type: token_pool, pool: first}, "
    "{type: dense, units: 10}]"
)

# The loaders: no dualtrain anywhere (any import of it raises), only the framework and the files.
BLOCK = "import sys; sys.modules['dualtrain'] = None\n"
TORCH_LOAD = (
    BLOCK
    + """
import importlib.util, numpy as np, torch
folder, images, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("exported", folder + "/model.py")
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
model = mod.load()
x = torch.from_numpy(np.load(images)).to(mod.DTYPE)
with torch.no_grad():
    np.save(out, model(x).double().numpy())
"""
)
KERAS_LOAD = (
    BLOCK
    + """
import os; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, keras
folder, images, out = sys.argv[1:4]
model = keras.saving.load_model(folder + "/model.keras")
x = np.load(images).transpose(0, 2, 3, 1)
np.save(out, np.asarray(model(x, training=False), dtype=np.float64))
"""
)


@pytest.fixture(  # default-suite time: the token model's exports run in CI's slow part
    scope="module",
    params=[LAYERS, pytest.param(TOKENS, marks=pytest.mark.slow)],
    ids=["cnn", "tokens"],
)
def trained(tmp_path_factory, request) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    args = [
        "run",
        "--backend",
        "torch",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--out",
        str(out),
    ]
    for s in (
        "model.preset=null",
        f"model.layers={request.param}",
        "data.train_limit=1000",
        "data.test_limit=500",
        "distribution.world_size=2",
        "optimizer.lr=0.05",
    ):
        args += ["--set", s]
    proc = run_cli(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def run_logits(run: Path, tmp_path: Path) -> tuple[np.ndarray, Path]:
    """The run's own logits on the first N test images (dualtrain's torch forward tool) and the
    normalised images the loaders get."""
    out = tmp_path / "logits.npz"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dualtrain.backends.torch.tools",
            "forward",
            str(run / "spec.yaml"),
            str(run / "weights_final.npz"),
            str(N),
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    images = tmp_path / "images.npy"
    np.save(images, open_data(load_spec(None)).inputs(TEST, slice(0, N))[0])
    with np.load(out) as z:
        return z["logits"].astype(np.float64), images


@pytest.mark.parametrize(
    "fmt,loader,tol",
    [("torch", TORCH_LOAD, 1e-5), pytest.param("keras", KERAS_LOAD, 1e-4, marks=pytest.mark.slow)],
)
def test_exported_model_gives_the_runs_logits(trained, tmp_path, fmt, loader, tol):
    folder = tmp_path / fmt
    proc = run_cli("export", str(trained), "--format", fmt, "--out", str(folder), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((folder / "export.json").read_text())
    assert meta["format"] == fmt and meta["output"] == "(N, 10): logits"
    expected, images = run_logits(trained, tmp_path)
    out = tmp_path / "exported.npy"
    proc = subprocess.run(
        [sys.executable, "-c", loader, str(folder), str(images), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    diff = float(np.abs(got - expected).max())
    print(f"{fmt}: max |logits diff| {diff:.3g} over {N} images")
    assert got.shape == (N, 10) and diff <= tol
    assert (got.argmax(1) == expected.argmax(1)).mean() == 1.0


def test_export_refuses_bad_input(trained, tmp_path):
    proc = run_cli("export", str(trained), "--format", "onnx", timeout=60)
    assert proc.returncode == 2 and "--format must be one of ['torch', 'keras']" in proc.stderr
    proc = run_cli("export", str(tmp_path), "--format", "torch", timeout=60)
    assert proc.returncode == 2 and "not a dualtrain run directory" in proc.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("keep me")
    proc = run_cli("export", str(trained), "--format", "torch", "--out", str(busy), timeout=60)
    assert proc.returncode == 2 and "--out is not empty" in proc.stderr
    assert (busy / "x").read_text() == "keep me"


def test_export_deletes_nothing_of_the_users_and_publishes_with_the_umask(trained, tmp_path):
    # issue 16: an existing X.tmp (the user's) survives an export into X; the files get the modes
    # the user's umask gives (safetensors alone writes 0600); a second export needs --overwrite,
    # which replaces a previous export and nothing else.
    import os
    import stat

    target = tmp_path / "x"
    mine = tmp_path / "x.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    proc = run_cli("export", str(trained), "--format", "torch", "--out", str(target), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (mine / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "x.tmp"]  # no temporary left
    mask = os.umask(0)
    os.umask(mask)
    for f in ("model.safetensors", "model.py", "export.json"):
        assert stat.S_IMODE((target / f).stat().st_mode) == 0o666 & ~mask, f
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~mask
    again = run_cli("export", str(trained), "--format", "torch", "--out", str(target), timeout=120)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    first = (target / "model.safetensors").read_bytes()
    again = run_cli(
        "export",
        str(trained),
        "--format",
        "torch",
        "--out",
        str(target),
        "--overwrite",
        timeout=120,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert (target / "model.safetensors").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "x.tmp"]
    # --overwrite never replaces a folder that is not an export
    proc = run_cli(
        "export", str(trained), "--format", "torch", "--out", str(mine), "--overwrite", timeout=120
    )
    assert proc.returncode == 2 and "holds something else" in proc.stderr
    assert (mine / "notes.txt").read_text() == "keep me"
