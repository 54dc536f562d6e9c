"""User mistakes: exit 2, one line on stderr naming the field and value, no traceback, no run
dir."""

from __future__ import annotations

import pytest

from testkit.cli import run_cli


@pytest.mark.parametrize(
    "yaml_text,extra,needle",
    [
        ("seed: [1, 2\n", (), "invalid YAML"),
        ("optimizer:\n  lrr: 0.1\n", (), "optimizer.lrr"),
        ("data:\n  batch_size: lots\n", (), "data.batch_size must be an integer. Received: 'lots'"),
        ("optimizer:\n  lr: -1\n", (), "optimizer.lr must be > 0. Received: -1.0"),
        ("seed: 0\n", ("--world-size", "0"), "distribution.world_size must be >= 1. Received: 0"),
        ("train:\n  accumulate: 0\n", (), "train.accumulate must be >= 1. Received: 0"),
        (
            "train:\n  early_stopping: {metric: val_loss}\n",
            (),
            "train.early_stopping.metric must be one of ['loss', 'accuracy'] (the validation "
            "fields need data.validation). Received: 'val_loss'",
        ),
        (
            "train:\n  early_stopping: {metric: los}\n",
            (),
            "train.early_stopping.metric must be one of ['loss', 'accuracy']",
        ),
        (
            "train:\n  early_stopping: {patience: 0}\n",
            (),
            "train.early_stopping.patience must be >= 1 or null. Received: 0",
        ),
        (
            "train:\n  early_stopping: {mode: lowest}\n",
            (),
            "train.early_stopping.mode must be one of",
        ),
        ("train:\n  keep_best: true\n", (), "train.keep_best needs train.early_stopping"),
        ("train:\n  ema: {decay: 1.0}\n", (), "train.ema.decay must be in [0, 1). Received: 1.0"),
        ("train:\n  ema: {every: 0}\n", (), "train.ema.every must be >= 1. Received: 0"),
        ("train:\n  ema: {beta: 0.9}\n", (), "unknown key 'train.ema.beta'"),
        ("train:\n  accumulate: two\n", (), "train.accumulate must be an integer"),
        (
            "data:\n  sharding: torch_sampler\ntrain:\n  accumulate: 2\n",
            (),
            "train.accumulate must be 1 with sharding=torch_sampler",
        ),
        (  # 64 samples per replica in 64 micro-batches of 1: one value for a dense batchnorm
            "model:\n  preset: null\n  layers: [{type: flatten}, {type: dense, units: 8}, "
            "{type: batchnorm}, "
            "{type: dense, units: 10}]\ndata:\n  batch_size: 2\ntrain:\n  accumulate: 64\n",
            ("--world-size", "2"),
            "in a micro-batch (train.accumulate)",
        ),
        (None, (), "config file not found"),
        ("", (), "the file is empty (no spec in it); to train on the defaults, leave out --config"),
        ("# only a comment\n", (), "the file is empty"),
        (
            "seed: 0\n",
            ("--backend", "jax"),
            "--backend must be one of ['torch', 'tf']. Received: 'jax'",
        ),
    ],
)
def test_user_mistake(tmp_path, yaml_text, extra, needle):
    cfg = tmp_path / "spec.yaml"
    if yaml_text is not None:
        cfg.write_text(yaml_text)
    out = tmp_path / "out"
    args = [
        "run",
        *(() if "--backend" in extra else ("--backend", "torch")),
        "--config",
        str(cfg),
        "--out",
        str(out),
        *extra,
    ]
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_config_folder_names_the_files_in_it(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "a.yaml").write_text("seed: 0\n")
    proc = run_cli(
        "run", "--backend", "torch", "--config", str(tmp_path / "cfg"), "--dry-run", timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"dualtrain: error: --config must be a YAML file, not a folder; "
        f"it holds a.yaml. Received: {str(tmp_path / 'cfg')!r}"
    )
