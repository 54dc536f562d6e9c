"""Every layer type of the spec has one entry in the tf backend's registry (training and the
Keras-only inference model for export), so a new layer type cannot be half-added."""

from dualtrain.backends.tf.model import LAYERS
from dualtrain.spec import LayerType


def test_every_layer_type_has_one_tf_entry():
    assert set(LAYERS) == set(LayerType)
    assert all(callable(v) for v in LAYERS.values())
