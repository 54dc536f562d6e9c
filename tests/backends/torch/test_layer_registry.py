"""Every layer type of the spec has one entry in the torch backend's registry (training module and
exported source), so a new layer type cannot be half-added."""

from dualtrain.backends.torch.model import LAYERS, TorchLayer
from dualtrain.spec import LayerType


def test_every_layer_type_has_one_torch_entry():
    assert set(LAYERS) == set(LayerType)
    assert all(isinstance(v, TorchLayer) for v in LAYERS.values())
