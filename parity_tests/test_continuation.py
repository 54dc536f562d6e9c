"""Cross-backend continuation: a torch checkpoint continued in TF (and the reverse) is the same
training run. In fp64 the continued run matches the source backend's uninterrupted run to the
reference bound (weights, optimizer state, batchnorm statistics and the step all carried over in
canonical form); in fp16 the loss-scale state carries over, so the scale and skip decisions of
"torch then TF" are torch's.
"""

import json

import pytest

from dualtrain.parity import compare_records
from dualtrain.parity.checks import Reference, check_reference_loss, check_reference_weights
from dualtrain.records.record import read_run
from dualtrain.runtime import checkpoint
from testkit.cli import run_cli
from testkit.parity_runs import MLP
from tools.mutants import hook

DATA = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "distribution.world_size=2",
    "train.checkpoint_every=5",
    "train.keep_checkpoints=5",
)
# Adam (m, v and the step), batchnorm after a conv and a dense layer, dropout, a conv kernel and a
# dense kernel (both transposed between the layouts). The layers before a batchnorm have no bias
# (docs/parity.md §9: under Adam a bias there is moved by eps-scaled rounding noise).
CNN = (
    "model.preset=null",
    "model.layers=[{type: conv2d, filters: 8, kernel_size: 3, bias: false}, "
    "{type: batchnorm}, {type: relu}, {type: maxpool2d, pool_size: 2}, {type: dropout, rate: 0.2}, "
    "{type: flatten}, {type: dense, units: 32, bias: false}, {type: batchnorm}, {type: relu}, "
    "{type: dense, units: 10}]",
    "optimizer.name=adam",
    "optimizer.lr=0.002",
)
MLP_SGD = ("optimizer.momentum=0.9", "optimizer.nesterov=true", "optimizer.schedule.name=cosine")
# tokens: patches, position, attention (packed q/k/v), layernorm, gelu and dropout on tokens, AdamW
VIT = (
    "model.preset=null",
    "model.layers=[{type: patches, size: 7, dim: 16}, {type: position}, {type: residual, body: "
    "[{type: layernorm}, {type: attention, heads: 4}, {type: dropout, rate: 0.1}]}, "
    "{type: residual, body: [{type: layernorm}, {type: dense, units: 32}, {type: gelu}, "
    "{type: dense, units: 16}]}, {type: layernorm}, {type: token_pool}, {type: dense, units: 10}]",
    "optimizer.name=adamw",
    "optimizer.lr=0.003",
    "optimizer.weight_decay=0.01",
)
CASES = {"cnn-bn-adam": CNN, "mlp-sgd-nesterov": MLP_SGD, "vit-adamw": VIT}
CASE_PARAMS = [
    "cnn-bn-adam",
    pytest.param("mlp-sgd-nesterov", marks=pytest.mark.slow),
    pytest.param("vit-adamw", marks=pytest.mark.slow),
]


def continued(runs, source: str, target: str, overrides: tuple[str, ...], step: int = 10):
    """(the source backend's uninterrupted run, the target backend continuing its step-``step``
    checkpoint), as RunRecords."""
    full = runs(source, *overrides)
    ckpt = checkpoint.step_dir(full, step)
    cont = runs.resume_from(target, ckpt, *overrides)
    return read_run(full), read_run(cont)


@pytest.mark.parametrize("case", CASE_PARAMS)
@pytest.mark.parametrize(
    "source,target", [("torch", "tf"), pytest.param("tf", "torch", marks=pytest.mark.slow)]
)
def test_fp64_continuation_matches_the_source_backend(runs, case, source, target):
    overrides = (*DATA, *CASES[case], "precision.dtype=fp64")
    full, cont = continued(runs, source, target, overrides)
    assert cont.summary["backend"] == target
    assert cont.summary["resumed"][0]["checkpoint_backend"] == source
    assert [r["step"] for r in cont.train] == list(
        range(1, 17)
    )  # one run: no step twice or missing
    for check in (
        check_reference_loss(Reference(full, cont)),
        check_reference_weights(Reference(full, cont)),
    ):
        print(f"{source} -> {target} {case}: {check.detail}")
        assert check.passed, check.detail
    # and `dualtrain compare` reads "source all the way" vs "source then target" as one spec
    assert compare_records(full, cont).passed


@pytest.mark.slow
def test_fp16_loss_scale_state_carries_over(runs):
    # A scale that starts at 2**20 backs off in the first steps; TF continuing torch's step-10
    # checkpoint makes exactly torch's later decisions.
    overrides = (
        *DATA,
        "precision.dtype=fp16",
        "precision.loss_scale.init=1048576",
        "precision.loss_scale.growth_interval=4",
    )
    full, cont = continued(runs, "torch", "tf", overrides)
    assert [r["loss_scale"] for r in cont.train] == [r["loss_scale"] for r in full.train]
    assert [r["skipped"] for r in cont.train] == [r["skipped"] for r in full.train]


@pytest.mark.slow
def test_a_continuation_that_parts_is_replayed_from_its_checkpoint(runs, tmp_path):
    # TF continuing torch's step-10 checkpoint with Keras's Adam eps planted (the worker hook): the
    # compare of "torch all the way" and "torch then TF" parts at step 11; compare continues the
    # checkpoint on both backends and names the first divergent operation after the switch
    overrides = (*DATA, "optimizer.name=adam", "optimizer.lr=0.001", "precision.dtype=fp64")
    full = runs("torch", *overrides)
    sets = [a for o in ("train.log_every=1000000", *overrides) for a in ("--set", o)]
    env = hook("adam_eps")
    ckpt = checkpoint.step_dir(full, 10)
    cont = tmp_path / "torch-then-tf"
    res = run_cli(
        "run",
        "--backend",
        "tf",
        "--config",
        MLP,
        *sets,
        "--resume-from",
        str(ckpt),
        "--out",
        str(cont),
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path / "cmp"
    res = run_cli("compare", str(full), str(cont), "--out", str(out), env=env)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    line = json.loads((out / "verdict.json").read_text())["verdict"]
    print(line)
    assert "after the switch at step 10: Adam's update of" in line, line
    assert "at step 11" in line and "eps 1e-07, Keras's default" in line, line
    assert (out / "replay" / "tf" / "checkpoints").is_dir()
