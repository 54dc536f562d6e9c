"""Dropout in a model pair, framework-free (dualtrain.core.pair.dropout): the two sides' dropout
calls are matched in forward order (rate 0 takes no part), a pair whose dropouts differ in number,
rate, kind or shape is one line naming them, the layout of the Keras mask follows the shapes, the
record round-trips (a pair without dropout keeps its digest), and a training forward hands each
call its mask in order, per thread."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from dualtrain.core import pair
from dualtrain.core.pair import dropout as pd
from dualtrain.errors import UserError


def _t(name, rate, shape, kind=pd.ELEMENT, cls="Dropout"):
    return pd.call_record(name, cls, kind, rate, shape)


def _k(name, rate, shape, kind=pd.ELEMENT, cls="Dropout", last=False):
    return pd.call_record(name, cls, kind, rate, shape, channels_last=last)


def test_calls_are_matched_in_order_and_rate_0_takes_no_part():
    torch = [_t("a", 0.25, (8, 4, 5)), _t("enc.dropout1", 0.0, (16,)), _t("b", 0.5, (60,))]
    keras = [_k("mha/dropout", 0.0, (2, 1, 1)), _k("a_", 0.25, (4, 5, 8)), _k("b_", 0.5, (60,))]
    a, b = pd.match(torch, keras)
    assert (a.torch, a.keras, a.keras_layout, a.elements) == ("a", "a_", pd.CHANNELS_LAST, 160)
    assert (b.torch, b.keras, b.keras_layout, b.elements) == ("b", "b_", pd.SAME, 60)


@pytest.mark.parametrize(
    "t_shape, k_shape, layout",
    [
        ((8, 4, 5), (4, 5, 8), pd.CHANNELS_LAST),  # NCHW vs NHWC
        ((4, 4, 4), (4, 4, 4), pd.CHANNELS_LAST),  # a 4-D activation: images, also when square
        ((7, 16), (7, 16), pd.SAME),  # a sequence (T, D), the same on both sides
        ((16, 7), (7, 16), pd.CHANNELS_LAST),  # a conv1d's (C, L) vs Keras's (L, C)
        ((60,), (60,), pd.SAME),
    ],
)
def test_the_keras_layout_follows_the_shapes(t_shape, k_shape, layout):
    (e,) = pd.match([_t("d", 0.1, t_shape)], [_k("d", 0.1, k_shape)])
    assert e.keras_layout == layout and e.shape == t_shape


def test_channel_dropout_takes_one_mask_per_channel_by_data_format():
    t = [_t("c", 0.5, (8, 4, 5), pd.CHANNEL, "Dropout2d")]
    (e,) = pd.match(t, [_k("c", 0.5, (4, 5, 8), pd.CHANNEL, "SpatialDropout2D", last=True)])
    assert e.elements == 8 and e.keras_layout == pd.CHANNELS_LAST
    (e,) = pd.match(t, [_k("c", 0.5, (8, 4, 5), pd.CHANNEL, "SpatialDropout2D")])
    assert e.keras_layout == pd.SAME


@pytest.mark.parametrize(
    "torch, keras, text",
    [
        (
            [_t("a", 0.1, (60,)), _t("b", 0.2, (60,))],
            [_k("a", 0.1, (60,))],
            "dropout layers differ: the torch forward calls 2 with a rate above 0 and the Keras "
            "one 1: torch 'b' (Dropout, rate 0.2) has no counterpart",
        ),
        (
            [_t("a", 0.1, (60,))],
            [_k("a", 0.1, (60,)), _k("z", 0.3, (60,))],
            "Keras 'z' (Dropout, rate 0.3) has no counterpart",
        ),
        (
            [_t("a", 0.1, (60,))],
            [_k("k", 0.2, (60,))],
            "dropout 1 differs in its rate: torch 'a' (Dropout, rate 0.1) vs Keras 'k' (Dropout, "
            "rate 0.2)",
        ),
        (
            [_t("a", 0.1, (8, 4, 5), pd.CHANNEL, "Dropout2d")],
            [_k("k", 0.1, (4, 5, 8))],
            "dropout 1 differs in its kind (elementwise vs channelwise)",
        ),
        ([_t("a", 0.1, (60,))], [_k("k", 0.1, (30,))], "takes [60] per sample"),
        ([_t("a", 1.0, (60,))], [_k("k", 1.0, (60,))], "drops every unit"),
    ],
    ids=["torch more", "keras more", "rate", "kind", "shape", "rate 1"],
)
def test_a_pair_whose_dropouts_differ_is_one_line_naming_them(torch, keras, text):
    with pytest.raises(UserError) as exc:
        pd.match(torch, keras)
    assert text in str(exc.value) and "\n" not in str(exc.value)


def _layout(dropouts=()):
    torch = pair.Side("t:f", "T", (10,), dropouts=tuple(_t("d", 0.5, (6,)) for _ in dropouts))
    keras = pair.Side("k:f", "K", (10,), dropouts=tuple(_k("d", 0.5, (6,)) for _ in dropouts))
    return pair.Layout(torch, keras, (), dropouts=pd.match(torch.dropouts, keras.dropouts))


def test_the_record_round_trips_and_a_pair_without_dropout_is_written_as_before():
    plain = _layout()
    assert "dropouts" not in plain.to_json() and "dropouts" not in plain.to_json()["torch"]
    with_drop = _layout((1,))
    back = pair.Layout.from_json(with_drop.to_json())
    assert back == with_drop and back.dropouts[0].shape == (6,)
    assert with_drop.digest() != replace(with_drop, dropouts=()).digest()


def test_a_training_forward_hands_out_the_masks_in_order_per_thread():
    entries = pd.match(
        [_t("a", 0.1, (4,)), _t("b", 0.2, (4,))], [_k("a", 0.1, (4,)), _k("b", 0.2, (4,))]
    )
    assert pd.mask_for("torch", "a", 0.1) is None  # outside a training forward: the identity
    seen = {}

    def replica(r):
        with pd.training_forward("keras", entries, 3, step=f"step{r}", ids=f"ids{r}"):
            first = pd.mask_for("keras", "a", 0.1)
            assert pd.mask_for("keras", "zero", 0.0) is None  # rate 0: no call counted
            seen[r] = (first, pd.mask_for("keras", "b", 0.2))

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(2):
        first, second = seen[r]
        assert (first.layer, first.ids, second.layer, second.step) == (1, f"ids{r}", 2, f"step{r}")
    with pytest.raises(UserError, match="called dropout 'b' as dropout 1, where its description"):
        with pd.training_forward("torch", entries, 3, 0, 0):
            pd.mask_for("torch", "b", 0.2)
    with pytest.raises(UserError, match="made 1 dropout call"):
        with pd.training_forward("torch", entries, 3, 0, 0):
            pd.mask_for("torch", "a", 0.1)
