"""A Keras record made with a model pair's weight map (issue 34): the weights under the torch
script's names and layout, so compare pairs them by name, and a faithful port's initial weights
are bit-identical where order-and-kind pairing cannot see it (a dense layer after a flatten, which
torch flattens as C, H, W and Keras as H, W, C; torch's packed q, k, v projection against Keras's
three kernels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from dualtrain.audit.checks import check_init
from dualtrain.audit.config import RunConfig
from dualtrain.audit.read import Recorded, Script
from dualtrain.core import pair
from dualtrain.core.pair.mapfile import canonical_from_keras
from dualtrain.errors import UserError

RNG = np.random.default_rng(0)
C, H, W, E, HEADS = 2, 3, 3, 4, 2
TORCH = {
    "conv.weight": RNG.normal(size=(C, 1, 3, 3)).astype(np.float32),
    "conv.bias": RNG.normal(size=C).astype(np.float32),
    "fc.weight": RNG.normal(size=(3 * E, C * H * W)).astype(np.float32),
    "attn.in_proj_weight": RNG.normal(size=(3 * E, E)).astype(np.float32),
}
MAP = [
    {"torch": "conv.weight", "keras": "conv/kernel", "transform": "oihw_hwio"},
    {"torch": "conv.bias", "keras": "conv/bias"},
    {"torch": "fc.weight", "keras": "fc/kernel", "transform": "flatten_chw", "chw": [C, H, W]},
    {
        "torch": "attn.in_proj_weight",
        "keras": ["attn/query/kernel", "attn/key/kernel", "attn/value/kernel"],
        "transform": "qkv_heads",
        "heads": HEADS,
    },
]


def _keras_side() -> dict[str, np.ndarray]:
    """The faithful port's Keras variables, from the torch arrays through the pair's transforms."""
    out = {}
    for e in MAP:
        targets = [e["keras"]] if isinstance(e["keras"], str) else e["keras"]
        entry = pair.MapEntry(
            e["torch"],
            targets[0] if len(targets) == 1 else tuple(targets),
            e.get("transform", "identity"),
            tuple(e["chw"]) if "chw" in e else None,
            e.get("heads"),
        )
        out.update(zip(targets, pair.to_keras_parts(entry, TORCH[e["torch"]]), strict=True))
    return out


def _map(tmp_path: Path, entries=MAP) -> str:
    path = tmp_path / "map.yaml"
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def _record(framework: str, weights: dict[str, np.ndarray]) -> Recorded:
    return Recorded(Path(framework), framework, 1, RunConfig(), Script(), [], {}, weights, weights)


def test_a_mapped_keras_record_has_torch_names_and_pairs_by_name(tmp_path):
    keras_side = {**_keras_side(), "dropout/seed_generator_state": np.zeros(2, np.uint32)}
    named = canonical_from_keras(_map(tmp_path), keras_side, [k for k in _keras_side()])
    assert sorted(named) == sorted(TORCH)
    assert all(np.array_equal(named[k], TORCH[k]) for k in TORCH)
    # the records list their arrays in another order: paired by name, bit-identical
    reordered = dict(reversed(list(named.items())))
    check = check_init(_record("torch", TORCH), _record("tf", reordered))
    assert check.status == "PASS", check.detail
    # one value changed in the port: the check fails naming the array
    changed = {**reordered, "fc.weight": reordered["fc.weight"] + np.float32(1e-3)}
    check = check_init(_record("torch", TORCH), _record("tf", changed))
    assert check.status == "FAIL" and "fc.weight" in check.detail


def test_order_pairing_without_the_map_cannot_see_a_faithful_flatten(tmp_path):
    # the same faithful port recorded without its map: Keras's dense kernel transposed by kind is
    # not torch's (H, W, C against C, H, W): the reason a pair's record takes its map
    keras_side = _keras_side()
    plain = {"fc.weight": keras_side["fc/kernel"].T}
    check = check_init(_record("torch", {"fc.weight": TORCH["fc.weight"]}), _record("tf", plain))
    assert check.status == "FAIL"


@pytest.mark.parametrize(
    "entries,expected",
    [
        (MAP[:-1], "leaves Keras attn/query/kernel out"),
        ([*MAP, {"torch": "x", "keras": "conv/bias"}], "maps Keras conv/bias twice"),
        ([{**MAP[0], "keras": "conv/kernel_typo"}], "no such variable in the Keras model"),
    ],
    ids=["unmapped", "twice", "unknown"],
)
def test_a_map_that_does_not_fit_the_keras_model_is_one_error(tmp_path, entries, expected):
    with pytest.raises(UserError, match=expected):
        canonical_from_keras(_map(tmp_path, entries), _keras_side(), list(_keras_side()))


def test_a_converters_port_pairs_by_its_values_and_a_changed_value_fails():
    """KerasHub's port of a Hugging Face model holds the source's numbers in another order,
    shape and layout (attention kernels (hidden, heads, head_dim), a layer norm built before the
    dense layers): neither by name nor in order do the arrays pair, by their values they do. One
    value off, or a fresh initialisation, fails the check."""
    from tests.audit.records import record

    torch_like = {
        "q.weight": RNG.normal(size=(4, 4)).astype(np.float32),
        "q.bias": np.zeros(4, np.float32),
        "ffn.weight": RNG.normal(size=(8, 4)).astype(np.float32),
        "ffn.bias": np.zeros(8, np.float32),
        "ln.weight": np.ones(4, np.float32),
        "ln.bias": np.zeros(4, np.float32),
    }
    port = {
        "attn/query/kernel": torch_like["q.weight"].T.reshape(4, 2, 2),
        "attn/query/bias": np.zeros((2, 2), np.float32),
        "ln/gamma": np.ones(4, np.float32),
        "ln/beta": np.zeros(4, np.float32),
        "ffn/kernel": torch_like["ffn.weight"].T.copy(),
        "ffn/bias": np.zeros(8, np.float32),
    }
    a, b = record("torch"), record("tf")
    a.weights_init, b.weights_init = torch_like, port
    check = check_init(a, b)
    assert check.status == "PASS", check.detail
    assert "6 arrays, bit-identical values (6 paired by their values" in check.detail
    b.weights_init = {
        **port,
        "ffn/kernel": port["ffn/kernel"]
        + np.float32(1e-3) * (port["ffn/kernel"] == port["ffn/kernel"].max()),
    }
    bad = check_init(a, b)
    assert bad.status == "FAIL" and "nor do they pair by their values" in bad.detail, bad.detail
    b.weights_init = {k: RNG.normal(size=v.shape).astype(np.float32) for k, v in port.items()}
    assert check_init(a, b).status == "FAIL"


def test_a_pairing_is_computed_once_for_a_pair_of_weight_sets():
    """A fix's check finds the differences again on copies of the records, which keep the
    weights: the pairing (by values, a sort of every array, for a converter's layout) is
    computed once and shared; a copy with other weights is paired afresh."""
    from dataclasses import replace

    from dualtrain.audit.pairing import paired_weights
    from tests.audit.records import record

    a, b = record("torch"), record("tf")
    first = paired_weights(a, b)
    assert paired_weights(replace(a, config={}), replace(b, config={})) is first
    assert len(a.pairings) == 1
    other = replace(a, weights_init={"w": np.ones(2, np.float32)})
    again = paired_weights(other, b)
    assert again is not first and len(a.pairings) == 2  # (the copy shares the store)
