"""Hugging Face's ViT and its KerasHub port, made by KerasHub's own converter
(configs/converted_vit.yaml): ``transformers.ViTModel`` (no pooler) with a Linear head on the
class token; the converter saves the ViT with ``save_pretrained`` and builds
``keras_hub.models.ViTBackbone.from_preset`` on that folder (offline), with the same head. The
8x8 digits are cut into 2x2 patches.

Two differences between the libraries, found by dualtrain on this pair: KerasHub's ViT converter
builds a backbone for 3-channel images whatever ``num_channels`` says (so both sides repeat the
grey channel three times), and it does not read ``layer_norm_eps``: KerasHub's ViT keeps its own
1e-6 where Hugging Face's default is 1e-12. This pair's torch side asks for 1e-6;
``vit_default_eps`` keeps Hugging Face's default, and dualtrain names the layer.

    dualtrain compare --config configs/converted_vit.yaml

Needs the ``hub`` extra (transformers, keras-hub).
"""

import tempfile

from torch import nn


class VitClassifier(nn.Module):
    """Images (N, 1, 8, 8), repeated to three channels -> ViT -> the class token -> Linear."""

    def __init__(self, width=32, layers=2, heads=4, classes=10, eps=1e-6):
        super().__init__()
        import transformers  # the hub extra

        config = transformers.ViTConfig(
            image_size=8,
            patch_size=2,
            num_channels=3,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=eps,
        )
        self.vit = transformers.ViTModel(config, add_pooling_layer=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        hidden = self.vit(pixel_values=x.expand(-1, 3, -1, -1)).last_hidden_state
        return self.head(hidden[:, 0])


def vit(width=32, layers=2, heads=4, classes=10):
    return VitClassifier(width, layers, heads, classes)


def vit_default_eps(width=32, layers=2, heads=4, classes=10):
    """Hugging Face's default layer_norm_eps (1e-12), which KerasHub's converter does not read."""
    return VitClassifier(width, layers, heads, classes, eps=1e-12)


def to_keras_hub(module):
    """KerasHub's ViT converter on the module's folder (its config and weights as
    ``save_pretrained`` writes them), with the same head."""
    import keras
    import keras_hub
    from safetensors.numpy import load_file, save_file

    with tempfile.TemporaryDirectory() as folder:
        module.vit.save_pretrained(folder)
        # KerasHub's ViT converter reads the weights of ViTForImageClassification (under "vit.")
        weights = f"{folder}/model.safetensors"
        save_file({f"vit.{k}": v for k, v in load_file(weights).items()}, weights)
        backbone = keras_hub.models.ViTBackbone.from_preset(folder)
    pixels = keras.Input((8, 8, 1))
    hidden = backbone(keras.ops.repeat(pixels, 3, axis=-1))
    head = keras.layers.Dense(module.head.out_features, name="head")
    out = head(hidden[:, 0])
    head.set_weights([module.head.weight.detach().numpy().T, module.head.bias.detach().numpy()])
    return keras.Model(pixels, out)
