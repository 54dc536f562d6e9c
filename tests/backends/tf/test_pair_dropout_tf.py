"""A model pair's dropout layers on the Keras side (dualtrain.core.pair.dropout): each Dropout /
SpatialDropout2D of the user's model takes, in a training forward, dualtrain.core.dropout's mask
laid out as the Keras activation is (NHWC: the torch layout's mask transposed), bit for bit what
the torch side takes (tests/backends/torch/test_pair_dropout_torch.py); the identity outside one
and at rate 0 (MultiHeadAttention's own dropout); a saved model holds Keras's own layers; a random
layer the pair cannot carry is one line."""

import numpy as np
import pytest

from dualtrain.core.dropout import NUMPY, keep
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.errors import UserError

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")


def _net():
    """NHWC feature maps (3 channels of 4x5) -> Dropout -> SpatialDropout2D -> flatten ->
    Dropout(0) -> the shared Dropout again -> a MultiHeadAttention (dropout 0)."""
    inp = keras.Input((4, 5, 2), dtype="float64")
    x = keras.layers.Conv2D(3, 1, dtype="float64")(inp)
    drop = keras.layers.Dropout(0.25, name="drop", dtype="float64")
    x = keras.layers.SpatialDropout2D(0.5, name="chan", dtype="float64")(drop(x))
    x = keras.layers.Dropout(0.0, name="none", dtype="float64")(keras.layers.Flatten()(x))
    x = keras.layers.Reshape((1, 60))(drop(x))
    x = keras.layers.MultiHeadAttention(2, 4, dtype="float64")(x, x)
    return keras.Model(inp, x)


def test_keras_masks_are_the_torch_layout_masks_transposed():
    from dualtrain.backends.tf.pair import dropout_calls, install_dropouts

    net = _net()
    install_dropouts(net)
    x = np.random.default_rng(0).normal(size=(6, 4, 5, 2))
    with dropout_calls() as calls:
        ref = net(x, training=False)
    assert [c["name"] for c in calls][:4] == ["drop", "chan", "none", "drop"]
    torch_side = [  # what the torch side of this model records (NCHW)
        pair_dropout.call_record("drop", "Dropout", "element", 0.25, (3, 4, 5)),
        pair_dropout.call_record("chan", "Dropout2d", "channel", 0.5, (3, 4, 5)),
        pair_dropout.call_record("drop", "Dropout", "element", 0.25, (60,)),
    ]
    entries = pair_dropout.match(torch_side, calls)
    # the shared dropout's second call takes a Flatten of the NHWC maps (through the rate-0 one)
    assert [e.keras_layout for e in entries] == ["channels_last", "channels_last", "flatten_hwc"]
    assert entries[2].chw == (3, 4, 5)
    assert np.array_equal(net(x, training=True), ref)  # no training forward open: the identity
    ids, step = tf.constant([3, 1, 4, 1, 5, 9], tf.int64), tf.constant(7, tf.int64)
    inp = keras.Input((4, 5, 3), dtype="float64")
    first = keras.Model(inp, keras.layers.Dropout(0.25, name="drop", dtype="float64")(inp))
    install_dropouts(first)
    maps = np.random.default_rng(1).normal(size=(6, 4, 5, 3))
    with pair_dropout.training_forward("keras", entries[:1], 11, step, ids):
        got = first(maps, training=True).numpy()  # call 1 of the forward
    mask = keep(NUMPY, 11, np.int64(7), ids.numpy(), 1, np.arange(60), 0.25)
    mask = mask.reshape(6, 3, 4, 5).transpose(0, 2, 3, 1)  # NCHW -> NHWC
    assert np.array_equal(got, np.where(mask, maps * (1 / 0.75), 0.0))
    # a Flatten's output of NHWC maps: the mask in Keras's H, W, C order
    flat = keras.Model(
        inp,
        keras.layers.Dropout(0.25, name="drop", dtype="float64")(
            keras.layers.Flatten(dtype="float64")(inp)
        ),
    )
    install_dropouts(flat)
    with pair_dropout.training_forward("keras", entries[2:], 11, step, ids):
        got = flat(maps, training=True).numpy()  # as call 3: the entry's layer
    mask = keep(NUMPY, 11, np.int64(7), ids.numpy(), 1, np.arange(60), 0.25)
    mask = mask.reshape(6, 3, 4, 5).transpose(0, 2, 3, 1).reshape(6, 60)
    assert np.array_equal(got, np.where(mask, maps.reshape(6, 60) * (1 / 0.75), 0.0))
    with pair_dropout.training_forward("keras", entries, 11, step, ids):
        out = net(x, training=True)
    assert not np.array_equal(out, ref)


def test_a_saved_model_holds_keras_own_dropout(tmp_path):
    from dualtrain.backends.tf.pair import install_dropouts

    net = _net()
    install_dropouts(net)
    net.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.get_layer("drop")) is keras.layers.Dropout
    assert "call" not in vars(loaded.get_layer("drop"))


@pytest.mark.parametrize(
    "layer, text",
    [
        (keras.layers.GaussianNoise(0.1), "GaussianNoise, which a model pair does not carry"),
        (keras.layers.AlphaDropout(0.1), "AlphaDropout, which a model pair does not carry"),
        (keras.layers.Dropout(0.1, noise_shape=(None, 1)), "a noise_shape"),
    ],
)
def test_a_random_layer_the_pair_cannot_mask_is_one_line(layer, text):
    from dualtrain.backends.tf.pair import install_dropouts

    inp = keras.Input((4,))
    with pytest.raises(UserError, match=text):
        install_dropouts(keras.Model(inp, layer(inp)))
