"""distribution.strategy (docs/strategies.md): parameter_server is refused, in one line that says
why and what to use, where it is not built."""

from __future__ import annotations

import pytest

from dualtrain.driver.validate import check_strategy
from dualtrain.errors import UserError
from dualtrain.spec import Backend, Strategy, load_spec
from testkit.cli import ROOT

CONFIG = ROOT / "configs" / "mnist_mlp.yaml"
PS = "distribution.strategy=parameter_server"
BN_LAYERS = (
    "[{type: flatten}, {type: dense, units: 32}, {type: batchnorm}, {type: relu},"
    " {type: dense, units: 10}]"
)


def test_all_reduce_is_the_default_and_cosmetic():
    from dualtrain.spec import COSMETIC, paths_with

    spec = load_spec(CONFIG)
    assert spec.distribution.strategy is Strategy.ALL_REDUCE
    # the same step either way: a parameter-server run compares with an all-reduce one
    assert "distribution.strategy" in paths_with(COSMETIC)


@pytest.mark.parametrize(
    ("backend", "sets", "says"),
    [
        (Backend.TF, ("model.preset=null", "model.layers=" + BN_LAYERS), "batchnorm on the tf"),
        (Backend.TORCH, ("distribution.device=gpu",), "device: gpu"),
    ],
)
def test_where_the_server_is_not_built_it_is_refused(backend, sets, says):
    spec = load_spec(CONFIG, [PS, *sets])
    with pytest.raises(UserError) as err:
        check_strategy(spec, backend)
    text = str(err.value)
    assert says in text and "use all_reduce" in text and "\n" not in text


def test_a_model_pair_through_tfs_server_is_refused_only_with_batchnorm():
    from dualtrain.core import pair

    spec = load_spec(CONFIG, [PS, "model.torch=m:f", "model.keras=m:g", "model.preset=null"])
    check_strategy(spec, Backend.TF)  # before the pair is described: its layers are not known

    def layout(kind: str) -> pair.Layout:
        layers = ({"name": "bn", "cls": "BatchNorm1d", "kind": kind, "in": [[8]]},)
        return pair.Layout(
            pair.Side("m:f", "M", (10,), layers=layers), pair.Side("m:g", "K", (10,)), ()
        )

    check_strategy(spec, Backend.TF, layout("dense"))
    check_strategy(spec, Backend.TORCH, layout("batchnorm"))
    with pytest.raises(UserError) as err:
        check_strategy(spec, Backend.TF, layout("batchnorm"))
    text = str(err.value)
    assert "a model pair's batchnorm on the tf backend (model.torch's 'bn' (BatchNorm1d)" in text
    assert "use all_reduce" in text and "\n" not in text


def test_on_cpu_without_checkpoints_it_is_accepted():
    for backend in (Backend.TORCH, Backend.TF):
        check_strategy(load_spec(CONFIG, [PS]), backend)
        check_strategy(load_spec(CONFIG, [PS, "train.checkpoint_every=10"]), backend)
    # batchnorm through torch's server: the replicas keep replica 0's statistics themselves
    check_strategy(
        load_spec(CONFIG, [PS, "model.preset=null", "model.layers=" + BN_LAYERS]), Backend.TORCH
    )


def test_under_an_external_launcher_or_from_a_checkpoint_it_is_refused(monkeypatch, tmp_path):
    from dualtrain.driver.runs import resolve_run

    spec = load_spec(CONFIG, [PS])
    with pytest.raises(UserError, match=r"use all_reduce here\. Received: --resume-from"):
        resolve_run(spec, Backend.TORCH, tmp_path / "run", resume_from=tmp_path / "ckpt")
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match=r"dualtrain's own launcher.*Received: launcher torch"):
        resolve_run(spec, Backend.TORCH, tmp_path / "run")
    assert not (tmp_path / "run").exists()
