"""BatchNorm and residual blocks in the spec, the canonical layout and the pre-launch batch check.
(The CLI's refusal, a real process: tests/integration/test_batchnorm_spec_cli.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core.model import param_shapes, resolve, walk
from dualtrain.core.plan import ShardPlan
from dualtrain.core.weights import init_weights
from dualtrain.driver.validate import check_batchnorm_batches
from dualtrain.errors import UserError
from dualtrain.spec import LastBatch, Sharding, from_dict, load_spec

BN_CNN = (
    "model.preset=null",
    "model.layers=[{type: conv2d, filters: 4, kernel_size: 3}, {type: batchnorm}, "
    "{type: relu}, {type: flatten}, {type: dense, units: 8}, {type: batchnorm, momentum: 0.2}, "
    "{type: dense, units: 10}]",
)
RESNET = (
    "model.preset=null",
    "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, padding: 1}, "
    "{type: batchnorm}, {type: relu}, {type: residual, body: [{type: conv2d, filters: 8, "
    "kernel_size: 3, stride: 2, padding: 1}, {type: batchnorm}, {type: relu}, {type: dropout, "
    "rate: 0.1}], shortcut: [{type: conv2d, filters: 8, kernel_size: 1, stride: 2}]}, "
    "{type: global_avgpool}, {type: dense, units: 10}]",
)


def test_batchnorm_layout_and_defaults():
    spec = load_spec(None, list(BN_CNN))
    bn, dense_bn = spec.model.layers[1], spec.model.layers[5]
    assert (bn.momentum, bn.eps, bn.sync) == (0.1, 1e-5, False)  # torch's defaults
    assert dense_bn.momentum == 0.2
    shapes = param_shapes(spec.model)
    assert {k: v for k, v in shapes.items() if k.startswith("1.")} == {
        "1.weight": (4,),
        "1.bias": (4,),
        "1.running_mean": (4,),
        "1.running_var": (4,),
    }
    assert shapes["5.running_var"] == (8,)
    w = init_weights(spec.model, 0)
    assert set(w) == set(shapes)
    # torch's reset, no random draw: the conv/dense weights are those of the model without batchnorm
    assert (w["1.weight"] == 1).all() and (w["1.bias"] == 0).all()
    assert (w["1.running_mean"] == 0).all() and (w["1.running_var"] == 1).all()
    plain = load_spec(
        None,
        [
            "model.preset=null",
            "model.layers=[{type: conv2d, filters: 4, "
            "kernel_size: 3}, {type: relu}, {type: flatten}, {type: dense, units: 8}, "
            "{type: dense, units: 10}]",
        ],
    ).model
    w0 = init_weights(plain, 0)
    np.testing.assert_array_equal(w["0.weight"], w0["0.weight"])
    np.testing.assert_array_equal(w["4.weight"], w0["3.weight"])


def test_residual_names_follow_torch_module_paths():
    model = load_spec(None, list(RESNET)).model
    names = list(param_shapes(model))
    assert names[6:10] == ["3.body.0.weight", "3.body.0.bias", "3.body.1.weight", "3.body.1.bias"]
    assert "3.shortcut.0.weight" in names and param_shapes(model)["3.shortcut.0.weight"] == (
        8,
        4,
        1,
        1,
    )
    block = resolve(model)[3]
    assert block.out_shape == (8, 14, 14)
    # unique layer ids for the dropout hash: top-level index, (block + 1) * 1000 + j inside a block
    assert [r.uid for r in walk(resolve(model))] == [0, 1, 2, 3, 4000, 4001, 4002, 4003, 4500, 4, 5]


def test_spec_round_trips_compactly():
    spec = load_spec(None, list(RESNET))
    layer = spec.to_dict()["model"]["layers"][3]
    assert set(layer) == {"type", "body", "shortcut"}
    assert layer["body"][1] == {"type": "batchnorm", "momentum": 0.1, "eps": 1e-5, "sync": False}
    assert from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "layers,needle",
    [
        (
            "[{type: batchnorm}, {type: flatten}, {type: dense, units: 10}]",
            "model.layers[0] (batchnorm) normalises the output of the layer before it",
        ),
        (
            "[{type: flatten}, {type: dense, units: 10}, {type: batchnorm, momentum: 1.5}]",
            "batchnorm.momentum must be in [0, 1]",
        ),
        (
            "[{type: flatten}, {type: dense, units: 10}, {type: batchnorm, eps: 0}]",
            "batchnorm.eps must be > 0",
        ),
        (
            "[{type: flatten}, {type: dense, units: 10, sync: true}]",
            "layer type 'dense' takes no 'sync'",
        ),
        (
            "[{type: conv2d, filters: 4, kernel_size: 3}, {type: residual, body: "
            "[{type: conv2d, filters: 8, kernel_size: 3, padding: 1}]}, {type: flatten}, "
            "{type: dense, units: 10}]",
            "model.layers[1] (residual): the body outputs (8, 26, 26) but the block input "
            "(identity shortcut)",
        ),
        (
            "[{type: residual, body: [{type: residual, body: [{type: relu}]}]}]",
            "blocks do not nest",
        ),
        ("[{type: residual, body: []}]", "residual.body must list at least one layer"),
        (
            "[{type: flatten}, {type: residual, body: [{type: dense, units: 5}]}, "
            "{type: dense, units: 10}]",
            "model.layers[1] (residual): the body outputs (5,)",
        ),
    ],
)
def test_bad_layers_are_one_line_errors(layers, needle):
    with pytest.raises(UserError) as exc:
        spec = load_spec(None, ["model.preset=null", f"model.layers={layers}"])
        resolve(spec.model)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "n,b,w,mode,drop",
    [
        (1001, 128, 3, Sharding.EXACT, False),
        (1025, 128, 3, Sharding.EXACT, False),
        (1025, 128, 3, Sharding.EXACT, True),
        (1001, 120, 4, Sharding.TORCH_SAMPLER, False),
        (1001, 120, 4, Sharding.TORCH_SAMPLER, True),
        (7, 8, 3, Sharding.EXACT, False),
    ],
)
def test_step_sizes_are_the_plans(n, b, w, mode, drop):
    plan = ShardPlan(
        num_samples=n,
        global_batch=b,
        world_size=w,
        seed=3,
        mode=mode,
        last_batch=LastBatch.DROP if drop else LastBatch.KEEP,
    )
    for epoch in (0, 1):
        for k in range(plan.steps_per_epoch):
            assert plan.step_sizes(k) == [len(ids) for ids in plan.step_ids(epoch, k)]


def _spec(*extra: str, sync: str = "false", dense: bool = True):
    dense_bn = f", {{type: batchnorm, sync: {sync}}}" if dense else ""
    return load_spec(
        None,
        [
            "model.preset=null",
            "model.layers=[{type: conv2d, filters: 4, kernel_size: "
            f"3}}, {{type: batchnorm, sync: {sync}}}, {{type: flatten}}, {{type: dense, "
            f"units: 8}}{dense_bn}, {{type: dense, units: 10}}]",
            "data.batch_size=64",
            *extra,
        ],
    )


def test_too_few_values_unsync_names_layer_step_and_replica():
    # 2,561 samples at batch 64: step 41 (the last of every epoch) holds 1 sample; world 2:
    # replica 1 holds none.
    with pytest.raises(UserError) as exc:
        check_batchnorm_batches(_spec("distribution.world_size=2"), 2561)
    msg = str(exc.value)
    assert msg.startswith(
        "model.layers[1] (batchnorm, sync: false): at step 41 (the last of every "
        "epoch) replica 1 holds 0 sample(s), 0 value(s) per channel"
    )
    assert "sync: true" in msg and "last_batch: drop" in msg


def test_too_few_values_after_dense_at_world_1():
    # One sample gives a conv batchnorm 26*26 values, a dense batchnorm one.
    with pytest.raises(
        UserError,
        match=r"model.layers\[4\] \(batchnorm, sync: false\): at step 41 "
        r"\(the last of every epoch\) replica 0 holds 1 sample",
    ):
        check_batchnorm_batches(_spec(), 2561)


def test_enough_values_pass():
    check_batchnorm_batches(_spec("distribution.world_size=2"), 2600)  # last step: 20 + 20
    check_batchnorm_batches(_spec("distribution.world_size=2", "data.last_batch=drop"), 2561)
    check_batchnorm_batches(_spec("distribution.world_size=2", "train.max_steps=40"), 2561)
    # sync: empty replicas add nothing; the global batch (1 sample x 26 x 26) is enough for a conv
    check_batchnorm_batches(_spec("distribution.world_size=3", sync="true", dense=False), 2561)


def test_sync_global_batch_of_one_value():
    with pytest.raises(
        UserError,
        match=r"model.layers\[4\] \(batchnorm, sync: true\): at step 41 .*"
        r"the global batch holds 1 sample",
    ):
        check_batchnorm_batches(_spec("distribution.world_size=3", sync="true"), 2561)
