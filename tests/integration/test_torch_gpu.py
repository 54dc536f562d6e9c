"""GPU path of the torch backend: nccl, CUDA autocast fp16 (GradScaler), bf16 and fp64.

Skipped on machines without CUDA (CI has none); with DUALTRAIN_TEST_GPU=1 a missing GPU is a
failure, so a GPU job cannot pass by skipping.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from testkit.torch_runs import npz, record, torch_run

torch = pytest.importorskip("torch")
REQUIRED = os.environ.get("DUALTRAIN_TEST_GPU") == "1"
N_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0

if REQUIRED and N_GPU == 0:
    pytest.fail("DUALTRAIN_TEST_GPU=1 but torch sees no CUDA device", pytrace=False)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(N_GPU == 0, reason="needs a CUDA GPU (set DUALTRAIN_TEST_GPU=1 to require)"),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "fp64"])
def test_gpu_run_trains(tmp_path, precision):
    world = min(N_GPU, 2)
    out = tmp_path / precision
    torch_run(
        out,
        "distribution.device=gpu",
        f"precision.dtype={precision}",
        "data.train_limit=12800",
        "train.epochs=1",
        world=world,
    )
    rec = record(out)
    assert rec.summary["process_group"] == "nccl"
    assert rec.summary["world_size"] == world
    assert rec.summary["test_accuracy"] > 0.85
    if precision == "fp16":
        assert {float(r["loss_scale"]) for r in rec.train} != {1.0}
    if precision == "fp64":
        assert {a.dtype for a in npz(out / "weights_final.npz").values()} == {np.dtype(np.float64)}


def test_gpu_fp64_agrees_with_cpu_fp64(tmp_path):
    # The fp64 reference on nccl/CUDA is the same run as on gloo/CPU, to fp64 rounding.
    sets = ("precision.dtype=fp64", "data.train_limit=1280", "train.epochs=1")
    torch_run(tmp_path / "gpu", "distribution.device=gpu", *sets, world=min(N_GPU, 2))
    torch_run(tmp_path / "cpu", *sets, world=min(N_GPU, 2))
    g, c = npz(tmp_path / "gpu" / "weights_final.npz"), npz(tmp_path / "cpu" / "weights_final.npz")
    for name in c:
        rel = float(np.linalg.norm(g[name] - c[name]) / np.linalg.norm(c[name]))
        assert rel <= 1e-10, (name, rel)


def test_gpu_gradient_equals_cpu_gradient(tmp_path):
    # One step from the same weights: nccl on the GPU and gloo on the CPU give the same averaged
    # gradient (TF32 is off in dualtrain's determinism settings).
    sets = ("data.train_limit=100", "train.max_steps=1", "debug.dump_grads=[1]")
    torch_run(tmp_path / "gpu", "distribution.device=gpu", *sets, world=min(N_GPU, 2))
    torch_run(tmp_path / "cpu", *sets, world=1)
    g, c = npz(tmp_path / "gpu" / "grads_step1.npz"), npz(tmp_path / "cpu" / "grads_step1.npz")
    for name in c:
        err = float(np.abs(g[name] - c[name]).max() / np.abs(c[name]).max())
        assert err <= 1e-5, (name, err)
