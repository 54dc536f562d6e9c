"""New layers and optimizers mean the same thing on both backends: the fp64 reference pair of a
model with every new layer (avgpool2d, global_avgpool, tanh, sigmoid, gelu in the exact erf form,
dropout with hashed masks) and of adadelta / rmsprop / adamax (torch.optim in the torch backend,
the same formulas written out in the TF one) agrees to the REFERENCE bounds, with uneven shards,
mirrored and multi_worker. Dropout masks that differed anywhere would put the pair O(1e-2) apart."""

import numpy as np
import pytest

from dualtrain.parity import compare_records
from dualtrain.parity.checks import Reference, check_reference_loss, check_reference_weights
from dualtrain.records.record import read_run
from testkit.cli import ROOT
from testkit.worker_hooks import hook_env

from .test_reference import assert_reference

DATA = ("data.train_limit=1001", "data.batch_size=128", "data.test_limit=500", "train.epochs=2")
LAYERS = (
    "model.preset=null",
    "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, {type: tanh}, "
    "{type: avgpool2d, pool_size: 2}, {type: conv2d, filters: 16, kernel_size: 3}, {type: gelu}, "
    "{type: global_avgpool}, {type: dense, units: 32}, {type: sigmoid}, {type: dense, units: 10}]",
    "optimizer.name=adam",
    "optimizer.lr=0.01",
)
BLOCK = (
    "{type: residual, body: [{type: layernorm}, {type: attention, heads: 2}, "
    "{type: dropout, rate: 0.1}]}, {type: residual, body: [{type: layernorm}, "
    "{type: dense, units: 32}, {type: gelu, approximate: tanh}, {type: dense, units: 16}]}"
)
CASES = {
    "layers-w3-multi_worker": (*LAYERS, "distribution.world_size=3", "tf.strategy=multi_worker"),
    # pytorch/examples mnist: Adadelta lr 1.0, StepLR(step_size=1, gamma=0.7) stepped per epoch
    "adadelta-steplr-per-epoch": (
        "optimizer.name=adadelta",
        "optimizer.lr=1.0",
        "optimizer.schedule.name=step",
        "optimizer.schedule.step_size=1",
        "optimizer.schedule.gamma=0.7",
        "optimizer.schedule.interval=epoch",
        "optimizer.weight_decay=0.001",
        "distribution.world_size=2",
    ),
    "rmsprop-centered-momentum-w3": (
        "optimizer.name=rmsprop",
        "optimizer.lr=0.001",
        "optimizer.momentum=0.9",
        "optimizer.centered=true",
        "optimizer.weight_decay=0.0001",
        "distribution.world_size=3",
    ),
    # added after the redesign of issue 31: a declaration (spec/optimizers.py) and a rule
    # (core/update_rules.py), nothing in either backend
    "adamax-w2": (
        "optimizer.name=adamax",
        "optimizer.lr=0.002",
        "optimizer.weight_decay=0.001",
        "distribution.world_size=2",
    ),
    "rmsprop-plain-w1": (
        "optimizer.name=rmsprop",
        "optimizer.lr=0.001",
        "optimizer.momentum=0.0",
        "distribution.world_size=1",
    ),
    "dropout-mlp-w3-multi_worker": (
        "model.preset=null",
        "model.layers=[{type: flatten}, {type: dropout, "
        "rate: 0.2}, {type: dense, units: 128}, {type: relu}, {type: dropout, "
        "rate: 0.5}, {type: dense, units: 10}]",
        "optimizer.lr=0.05",
        "distribution.world_size=3",
        "tf.strategy=multi_worker",
    ),
    # layernorm (torch's nn.LayerNorm; Keras's LayerNormalization with torch's eps), with gelu and
    # dropout between dense layers, as in a transformer's MLP block
    "layernorm-w2": (
        "model.preset=null",
        "model.layers=[{type: flatten}, {type: dense, units: 64}, {type: layernorm}, "
        "{type: gelu}, {type: dropout, rate: 0.1}, {type: dense, units: 64}, "
        "{type: layernorm, eps: 0.001}, {type: gelu, approximate: tanh}, {type: dense, units: 10}]",
        "optimizer.lr=0.003",
        "distribution.world_size=2",
    ),
    # tokens (issue 33): patches, a learned position embedding, pre-LN blocks of self-attention
    # (torch's nn.MultiheadAttention parameters) and an MLP on (T, D) tokens, dropout on tokens,
    # the first token or the mean; silu (added with the layer declarations: one Kind, one entry
    # per backend)
    "tokens-w2": (
        "model.preset=null",
        f"model.layers=[{{type: patches, size: 7, dim: 16}}, {{type: position}}, {BLOCK}, "
        "{type: layernorm}, {type: token_pool, pool: first}, {type: silu}, "
        "{type: dense, units: 10}]",
        "optimizer.name=adamw",
        "optimizer.lr=0.003",
        "distribution.world_size=2",
    ),
    "tokens-causal-w3-multi_worker": (
        "model.preset=null",
        f"model.layers=[{{type: patches, size: 14, dim: 16, bias: false}}, {{type: position}}, "
        f"{BLOCK.replace('heads: 2', 'heads: 4, causal: true')}, {{type: token_pool}}, "
        "{type: dense, units: 10}]",
        "optimizer.name=adamw",
        "optimizer.lr=0.003",
        "distribution.world_size=3",
        "tf.strategy=multi_worker",
    ),
    "dropout-cnn-w2": (
        "model.preset=null",
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, "
        "{type: relu}, {type: dropout, rate: 0.25}, {type: maxpool2d, pool_size: 2}, "
        "{type: flatten}, {type: dropout, rate: 0.5}, {type: dense, units: 10}]",
        "optimizer.lr=0.05",
        "distribution.world_size=2",
    ),
}


# In the slow set: rmsprop-plain-w1 (rmsprop-centered-momentum-w3 covers the rule), adamax-w2
# (tests/backends/torch/test_update_rules_torch.py holds its rule to torch.optim in the default
# suite) and dropout-mlp-w3-multi_worker (dropout-cnn-w2 covers the masks, layers-w3-multi_worker
# the strategy).
SLOW_CASES = (
    "rmsprop-plain-w1",
    "dropout-mlp-w3-multi_worker",
    "adamax-w2",
    "tokens-causal-w3-multi_worker",
)


@pytest.mark.parametrize(
    "case", [c if c not in SLOW_CASES else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def test_reference_pair_agrees(runs, case):
    ref = runs.reference(*DATA, *CASES[case])
    assert_reference(ref)
    losses = [r["loss"] for r in ref.a.train]
    assert losses[-1] < losses[0], losses  # it trains (16 steps: only a little for some)


#: a planted difference on the TF side (a test hook) that the fp64 pair must fail on: the case it
#: runs, the hook
PLANTED = {
    # the TF side's layernorm at Keras's default eps (1e-3)
    "layernorm-eps-keras-default": ("layernorm-w2", "testkit.worker_hooks:layernorm_eps=0.001"),
    # the TF side's attention splits each projection into heads as head_dim x heads (same
    # parameters, same shapes)
    "attention-heads-transposed": ("tokens-w2", "testkit.worker_hooks:attention_heads_transposed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("planted", PLANTED)
def test_a_difference_planted_on_one_side_fails_the_pair(runs, planted):
    # the check can fail
    case, hook = PLANTED[planted]
    overrides = (*DATA, *CASES[case], "precision.dtype=fp64")
    a = read_run(runs("torch", *overrides))
    b = read_run(runs("tf", *overrides, env=hook_env(hook)))
    check = check_reference_loss(Reference(a, b))
    print(check.detail)
    assert not check.passed and check.first_step == 1


def test_epoch_schedule_changes_the_lr_once_per_epoch(runs):
    rec = runs.reference(*DATA, *CASES["adadelta-steplr-per-epoch"]).a
    lrs = {}
    for r in rec.train:
        lrs.setdefault(r["epoch"], set()).add(r["lr"])
    assert lrs == {1: {1.0}, 2: {0.7}}


# Both slow: the default suite's fp32 compare of a CNN with dropout (and batchnorm) is
# test_batchnorm.test_fp32_compare_passes_for_cnn_with_dropout_and_batchnorm.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["layers-w3-multi_worker", "dropout-cnn-w2"])
def test_fp32_pair_passes_compare_against_its_reference(runs, case):
    overrides = (*DATA, *CASES[case])
    a = read_run(runs("torch", *overrides))
    b = read_run(runs("tf", *overrides))
    cmp = compare_records(a, b, runs.reference(*overrides))
    assert cmp.passed, cmp.diagnosis.summary()


def test_dropout_masks_do_not_depend_on_the_world_size(runs):
    # The same spec on 1 and on 3 torch ranks: each sample keeps its mask wherever it is fed, so the
    # two fp64 runs agree to rounding (a per-replica mask would part them at step 1).
    overrides = (*DATA, *CASES["dropout-mlp-w3-multi_worker"][:-2], "precision.dtype=fp64")
    one = read_run(runs("torch", *overrides, "distribution.world_size=1"))
    three = read_run(runs("torch", *overrides, "distribution.world_size=3"))
    for check in (
        check_reference_loss(Reference(one, three)),
        check_reference_weights(Reference(one, three)),
    ):
        assert check.passed, check.detail


@pytest.mark.parametrize(
    "config",
    [
        pytest.param("pytorch_examples_mnist", marks=pytest.mark.slow),
        pytest.param("keras_io_mnist_convnet", marks=pytest.mark.slow),
        pytest.param("mnist_resnet_bn", marks=pytest.mark.slow),
    ],
)
def test_reference_configs_mean_the_same_on_both_backends(runs, config):
    # The two canonical MNIST models as shipped (dropout, Adadelta + per-epoch StepLR / Adam with
    # Keras's eps) and the residual CNN with sync batchnorm, on 1,001 samples for 2 epochs, world 2:
    # the fp64 pair agrees to its bound.
    ref = runs.reference(
        "data.train_limit=1001",
        "data.test_limit=500",
        "train.epochs=2",
        config=str(ROOT / "configs" / f"{config}.yaml"),
    )
    assert_reference(ref)


def test_embedding_of_integer_ids_agrees(runs, tmp_path):
    # integer ids (T = 10 per sample, vocab 12) through an embedding, a causal attention block and
    # the mean over tokens: a sequence task (more 3s than 7s), your own arrays, not normalised
    rng = np.random.default_rng(0)
    x = rng.integers(0, 12, size=(1200, 10))
    y = ((x == 3).sum(1) > (x == 7).sum(1)).astype(np.int64)
    path = tmp_path / "ids.npz"
    np.savez(path, x_train=x[:1000], y_train=y[:1000], x_test=x[1000:], y_test=y[1000:])
    ref = runs.reference(
        "data.dataset=arrays",
        f"data.path={path}",
        "data.normalize=none",
        "data.batch_size=128",
        "train.epochs=2",
        "model.inputs=[{name: x, shape: [10]}]",
        "model.preset=null",
        "model.layers=[{type: embedding, vocab: 12, dim: 16}, {type: position}, {type: residual, "
        "body: [{type: layernorm}, {type: attention, heads: 2, causal: true}]}, "
        "{type: token_pool}, {type: dense, units: 2}]",
        "optimizer.name=adam",
        "optimizer.lr=0.01",
        "distribution.world_size=2",
    )
    assert_reference(ref)
    losses = [r["loss"] for r in ref.a.train]
    assert losses[-1] < losses[0], losses
