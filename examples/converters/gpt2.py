"""Hugging Face's GPT-2 and its KerasHub port, made by the converter KerasHub ships
(configs/converted_gpt2.yaml): the torch side is ``transformers.GPT2Model`` with a mean-pool and
a Linear head; the converter saves the GPT-2 with ``save_pretrained`` and builds
``keras_hub.models.GPT2Backbone.from_preset`` on that folder (offline, no download), then puts the
same pool and head on it. Each 8x8 digit is read as 64 tokens (its pixel values 0..16).

    dualtrain compare --config configs/converted_gpt2.yaml

Needs the ``hub`` extra (transformers, keras-hub).
"""

import tempfile

import torch
from torch import nn


class Gpt2Classifier(nn.Module):
    """Token ids (N, 64) -> GPT-2 -> the mean over the tokens -> Linear."""

    def __init__(self, width=32, layers=2, heads=4, classes=10, tokens=64, vocab=17):
        super().__init__()
        import transformers  # the hub extra

        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_positions=tokens,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        self.gpt2 = transformers.GPT2Model(config)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        ids = x.flatten(1).to(torch.long)
        hidden = self.gpt2(input_ids=ids).last_hidden_state
        return self.head(hidden.mean(dim=1))


def gpt2(width=32, layers=2, heads=4, classes=10):
    return Gpt2Classifier(width, layers, heads, classes)


def to_keras_hub(module):
    """KerasHub's GPT-2 converter on the module's ``save_pretrained`` folder, with the same pool
    and head."""
    import keras
    import keras_hub

    with tempfile.TemporaryDirectory() as folder:
        module.gpt2.save_pretrained(folder)
        backbone = keras_hub.models.GPT2Backbone.from_preset(folder)
    pixels = keras.Input((8, 8, 1))
    ids = keras.ops.cast(keras.ops.reshape(pixels, (-1, 64)), "int32")
    hidden = backbone({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)})
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    head = keras.layers.Dense(module.head.out_features, name="head")
    out = head(pooled)
    head.set_weights([module.head.weight.detach().numpy().T, module.head.bias.detach().numpy()])
    return keras.Model(pixels, out)


def to_keras_hub_kv_swapped(module):
    """A converter with a classic mistake: the key and value projections swapped."""
    net = to_keras_hub(module)
    backbone = next(la for la in net.layers if la.name.startswith("gpt2_backbone"))
    for block in range(module.gpt2.config.n_layer):
        attention = backbone.get_layer(f"transformer_layer_{block}")._self_attention_layer
        key, value = attention._key_dense, attention._value_dense
        k, v = key.get_weights(), value.get_weights()
        key.set_weights(v)
        value.set_weights(k)
    return net


def to_keras_hub_heads_transposed(module):
    """A converter with a classic mistake: each projection's features split into (heads, head
    size) head size first, then swapped into place."""
    net = to_keras_hub(module)
    backbone = next(la for la in net.layers if la.name.startswith("gpt2_backbone"))
    for block in range(module.gpt2.config.n_layer):
        attention = backbone.get_layer(f"transformer_layer_{block}")._self_attention_layer
        for dense in (attention._query_dense, attention._key_dense, attention._value_dense):
            kernel, bias = dense.get_weights()  # (hidden, heads, size), (heads, size)
            heads, size = bias.shape
            kernel = kernel.reshape(-1, size, heads).swapaxes(1, 2)
            dense.set_weights([kernel, bias.reshape(size, heads).T])
    return net
