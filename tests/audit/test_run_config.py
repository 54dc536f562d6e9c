"""The typed sections of an audit record's set-up (dualtrain.audit.config): what the recorders
write as JSON is read into them once, a fix's edits go through the JSON and are read again, and a
key no section reads is said, not dropped in silence."""

from __future__ import annotations

import pytest

from dualtrain.audit.config import (
    BatchNormLayer,
    LossScale,
    NotHeld,
    Options,
    RunConfig,
)

TORCH = {
    "optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9, "groups": [{"weight_decay": 0.0}]},
    "scheduler": {"type": "StepLR", "step_size": 2, "step_lines": [7]},
    "sampler": {
        "type": "DistributedSampler",
        "shuffle": True,
        "seed": 0,
        "total_size": 10,
        "dataset_size": 9,
        "epochs": [0, 0],
    },  # fmt: skip
    "loader": {"batch_size": 4, "drop_last": False, "batches": None, "dataset": "TensorDataset"},
    "precision": {"param_dtype": "float32", "autocast": "bfloat16", "compute_dtype": "bfloat16"},
    "loss_scale": {
        "type": "GradScaler",
        "initial_scale": 65536.0,
        "growth_interval": 2000,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
    },  # fmt: skip
    "batchnorm": [{"name": "bn", "momentum": None, "eps": 1e-5, "convention": "torch"}],
    "not_held": {"names": ["head.weight"], "of": 4},
    "replicas": {"arrays": 4, "init": {}, "final": {"1": ["fc.weight"]}},
    "clipping": {"steps": 6, "calls": [{"function": "clip_grad_norm_", "limit": 1.0, "steps": 6}]},
    "ddp": True,
    "random_layers": [],
    "epochs": "counted",
}


def test_each_section_is_read_typed():
    config = RunConfig.from_json(TORCH)
    assert config.optimizer.type == "SGD" and config.optimizer["momentum"] == 0.9
    assert config.sampler.type == "DistributedSampler" and config.sampler.dataset_size == 9
    assert config.sampler.epochs == (0, 0) and "dataset_size" not in config.sampler.options
    assert config.loader is not None and config.loader.batch_size == 4
    assert config.precision.dtype("compute_dtype") == "bfloat16"
    assert config.loss_scale == LossScale("GradScaler", 65536.0, 2000, 2.0, 0.5)
    assert config.batchnorm == (BatchNormLayer("bn", None, 1e-5, "torch", None),)
    assert config.not_held == NotHeld(("head.weight",), 4)
    assert config.replicas is not None and config.replicas.apart("final") == (
        {"1": ("fc.weight",)},
        {},
    )
    assert config.clipping is not None and config.clipping.steps == 6
    assert config.ddp is True and config.random_layers == () and config.epochs == "counted"
    assert config.unread() == set()


def test_an_absent_section_is_empty_and_an_unsaid_one_none():
    config = RunConfig.from_json({})
    assert not config.optimizer and config.optimizer.type is None and not config.sampler
    assert config.loss_scale is None and config.not_held is None and config.replicas is None
    assert config.ddp is None and config.random_layers is None  # the record does not say
    assert config.data.workers == 1 and config.data.fit_shuffle is False


def test_an_edit_goes_through_the_json_and_is_read_again():
    config = RunConfig.from_json(TORCH)
    edited = config.edited({"optimizer": {**config.optimizer, "momentum": 0.5}})
    assert edited.optimizer["momentum"] == 0.5 and config.optimizer["momentum"] == 0.9
    assert config.without("not_held").not_held is None and config.not_held is not None


def test_options_are_read_only():
    options = Options({"type": "SGD", "lr": 0.1})
    with pytest.raises(TypeError):
        options["lr"] = 1.0
    assert options == {"type": "SGD", "lr": 0.1}


def test_a_key_no_section_reads_is_said():
    assert RunConfig.from_json({**TORCH, "new_fact": 1}).unread() == {"new_fact"}
