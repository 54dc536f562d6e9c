import dataclasses

import pytest
import yaml

from dualtrain.errors import UserError
from dualtrain.spec import (
    Experiment,
    LayerType,
    OptimizerName,
    Precision,
    Sharding,
    apply_overrides,
    dump_spec,
    from_dict,
    load_spec,
)


def test_configs_load(tmp_path):
    from testkit.cli import ROOT

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        spec = load_spec(path)
        assert isinstance(spec, Experiment)


def test_round_trip_is_identity():
    spec = load_spec(
        None,
        [
            "model.preset=cnn",
            "optimizer.name=adamw",
            "optimizer.betas=[0.8, 0.99]",
            "precision=bf16",
            "debug.nonfinite_grad=[[2, 1]]",
        ],
    )
    again = from_dict(yaml.safe_load(dump_spec(spec)))
    assert again == spec
    assert again.optimizer.betas == (0.8, 0.99)
    assert again.debug.nonfinite_grad == ((2, 1),)


def test_frozen():
    spec = load_spec(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 3  # type: ignore[misc]


def test_enums_and_short_forms():
    spec = load_spec(None, ["precision=fp16", "optimizer.name=adam", "data.sharding=torch_sampler"])
    assert spec.precision.dtype is Precision.FP16
    assert spec.optimizer.name is OptimizerName.ADAM
    assert spec.data.sharding is Sharding.TORCH_SAMPLER
    assert spec.model.resolved_layers()[0].type is LayerType.FLATTEN


def test_yaml_exponent_strings_are_numbers():
    # PyYAML reads "1e-3" (no dot) as a string; the spec still takes it as a float.
    assert load_spec(None, ["optimizer.lr=1e-3"]).optimizer.lr == 0.001


@pytest.mark.parametrize(
    "override, words",
    [
        ("optimizer.lrr=1", ["unknown key 'optimizer.lrr'", "lrr=1"]),
        ("bogus=1", ["unknown key 'bogus'"]),
        ("optimizer.lr=-1", ["optimizer.lr", "Received: -1"]),
        ("data.batch_size=abc", ["data.batch_size", "'abc'"]),
        ("data.batch_size=0", ["data.batch_size", "0"]),
        ("precision.dtype=fp8", ["precision.dtype", "'fp8'"]),
        ("tf.strategy=ps", ["tf.strategy", "'ps'"]),
        ("determinism=maybe", ["determinism", "'maybe'"]),
        ("model.layers=[{type: dense}]", ["model.layers[0]", "units"]),
        ("model.layers=[{type: relu, units: 3}]", ["model.layers[0]", "units=3"]),
        ("model.layers=[{units: 3}]", ["model.layers[0]", "type"]),
        ("optimizer.nesterov=true", ["optimizer.nesterov", "momentum"]),
        ("optimizer.betas=[0.9]", ["optimizer.betas"]),
        ("train.epochs=null", ["train", "epochs or max_steps"]),
        (
            "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, padding: samee}]",
            ["model.layers[0].padding", "or an integer", "'samee'"],
        ),
        (
            "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, padding: -1}]",
            ["padding", ">= 0", "-1"],
        ),
        (
            "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, stride: 2, padding: same}]",
            ["'same' needs stride 1", "integer padding"],
        ),
        ("model.layers=[{type: relu, padding: 1}]", ["takes no 'padding'"]),
    ],
)
def test_errors_name_field_and_value(override, words):
    with pytest.raises(UserError) as err:
        load_spec(None, [override])
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_integer_padding_sizes_a_strided_conv():
    from dualtrain.core.model import param_shapes, resolve

    spec = load_spec(
        None,
        [
            "model.preset=null",
            "model.layers=[{type: conv2d, filters: 4, "
            "kernel_size: 3, stride: 2, padding: 1}, {type: flatten}, "
            "{type: dense, units: 10}]",
        ],
    )
    assert spec.model.layers[0].padding == 1
    assert resolve(spec.model)[0].out_shape == (4, 14, 14)  # (28 + 2 - 3) // 2 + 1
    assert param_shapes(spec.model)["2.weight"] == (10, 4 * 14 * 14)
    assert load_spec(None, ["precision=fp64"]).precision.dtype.param_dtype == "float64"


def test_preset_and_layers_are_exclusive():
    with pytest.raises(UserError, match="not both"):
        load_spec(
            None, ["model.preset=mlp", "model.layers=[{type: flatten}, {type: dense, units: 10}]"]
        )
    spec = load_spec(None, ["model.layers=[{type: flatten}, {type: dense, units: 10}]"])
    assert spec.model.preset is None and len(spec.model.resolved_layers()) == 2
    assert load_spec(None, ["model.init_from=x.npz"]).model.preset == "mlp"  # default model


def test_torch_sampler_needs_divisible_batch():
    with pytest.raises(UserError, match="multiple of world_size=3"):
        load_spec(
            None,
            ["data.sharding=torch_sampler", "distribution.world_size=3", "data.batch_size=128"],
        )


def test_override_parsing():
    raw = apply_overrides({"optimizer": {"lr": 0.1}}, ["optimizer.momentum=0.9", "name=x y"])
    assert raw == {"optimizer": {"lr": 0.1, "momentum": 0.9}, "name": "x y"}
    with pytest.raises(UserError, match="key.path=value"):
        apply_overrides({}, ["optimizer.lr"])
    with pytest.raises(UserError, match="not a section"):
        apply_overrides({"seed": 1}, ["seed.x=1"])


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match="invalid YAML at line"):
        load_spec(p)
    p.write_text("- a list\n")
    with pytest.raises(UserError, match="mapping"):
        load_spec(p)
    with pytest.raises(UserError, match="not found"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "raw,path,want",
    [
        ({"optimizer": {"name": "Adam"}}, ("optimizer", "name"), "adam"),
        ({"optimizer": {"name": "AdamW"}}, ("optimizer", "name"), "adamw"),
        ({"precision": "mixed_float16"}, ("precision", "dtype"), "fp16"),
        ({"precision": "bfloat16"}, ("precision", "dtype"), "bf16"),
        ({"precision": "float64"}, ("precision", "dtype"), "fp64"),
        (
            {"optimizer": {"schedule": {"name": "CosineAnnealingLR"}}},
            ("optimizer", "schedule", "name"),
            "cosine",
        ),
    ],
)
def test_names_from_the_frameworks_are_read_and_recorded_canonically(raw, path, want):
    from dualtrain.spec import dump_spec, from_dict

    spec = from_dict(raw)
    node = spec
    for p in path:
        node = getattr(node, p)
    assert node.value == want
    assert f": {want}\n" in dump_spec(spec)  # what the run records is the canonical name


def test_layer_types_in_keras_and_torch_spelling():
    from dualtrain.spec import LayerType, from_dict

    spec = from_dict(
        {
            "model": {
                "preset": None,
                "layers": [
                    {"type": "Conv2D", "filters": 4, "kernel_size": 3},
                    {"type": "BatchNormalization"},
                    {"type": "ReLU"},
                    {"type": "MaxPooling2D", "pool_size": 2},
                    {"type": "Flatten"},
                    {"type": "Linear", "units": 10},
                ],
            }
        }
    )
    assert [x.type for x in spec.model.layers] == [
        LayerType.CONV2D,
        LayerType.BATCHNORM,
        LayerType.RELU,
        LayerType.MAXPOOL2D,
        LayerType.FLATTEN,
        LayerType.DENSE,
    ]


def test_every_mistake_of_a_spec_at_once_with_suggestions():
    from dualtrain.spec import from_dict

    with pytest.raises(UserError) as err:
        from_dict(
            {"optimizer": {"name": "adamm", "lrr": 1}, "data": {"batch_size": "x"}, "seedd": 1}
        )
    text = str(err.value)
    assert text.startswith("4 mistakes in the spec: ")
    assert "did you mean 'seed'?" in text and "did you mean 'lr'?" in text
    assert (
        "did you mean 'adam' or 'adamw'?" in text and "data.batch_size must be an integer" in text
    )
    assert "\n" not in text  # one line


def test_every_field_policy_names_a_field_of_the_schema():
    """The spec paths the schema tags (cosmetic for compare, free on continuation, the record a
    difference shows in, which the diagnosis reads) all name real fields, and the diagnosis reads
    the tags: a renamed field cannot leave a stale entry."""
    from dualtrain.parity.diagnose import IDS, INIT, LR, SCALE, explained_by
    from dualtrain.spec import (
        COSMETIC,
        FREE,
        SHOWS_IN_IDS,
        SHOWS_IN_INIT,
        SHOWS_IN_LR,
        SHOWS_IN_SCALE,
        has_path,
        paths_with,
    )

    shows = (SHOWS_IN_IDS, SHOWS_IN_INIT, SHOWS_IN_LR, SHOWS_IN_SCALE)
    named = [*paths_with(COSMETIC), *paths_with(FREE), *(p for t in shows for p in paths_with(t))]
    assert named and all(has_path(p) for p in named), [p for p in named if not has_path(p)]
    assert not has_path("optimizer.lrr") and not has_path("distribution.world_size.x")
    # what the tags mean, on fields whose role is plain
    assert "distribution.master_port" in paths_with(COSMETIC)
    assert "optimizer.lr" not in paths_with(COSMETIC) and "seed" not in paths_with(FREE)
    assert "distribution" in paths_with(FREE)  # a tagged section: everything under it
    assert set(explained_by("seed")) == {IDS, INIT} and explained_by("data.batch_size") == (IDS,)
    assert explained_by("optimizer.schedule.gamma") == (LR,) == explained_by("optimizer.lr")
    assert explained_by("precision.loss_scale.init") == (SCALE,)
    assert explained_by("optimizer.momentum") == () == explained_by("optimizer.lrr")
