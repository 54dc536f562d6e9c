"""Hugging Face's Llama 3 and its KerasHub port, made by KerasHub's own converter
(configs/converted_llama.yaml): ``transformers.LlamaForCausalLM``'s model (RMSNorm, rotary
positions, grouped-query attention, a SwiGLU MLP) with a mean-pool and a Linear head; the
converter saves it with ``save_pretrained`` and builds
``keras_hub.models.LlamaBackbone.from_preset`` on that folder (offline), with the same pool and
head. Each 8x8 digit is read as 64 tokens.

    dualtrain compare --config configs/converted_llama.yaml

Needs the ``hub`` extra (transformers, keras-hub).
"""

import tempfile

import torch
from torch import nn


class LlamaClassifier(nn.Module):
    """Token ids (N, 64) -> Llama -> the mean over the tokens -> Linear."""

    def __init__(self, width=32, layers=2, heads=4, kv_heads=2, classes=10, tokens=64, vocab=17):
        super().__init__()
        import transformers  # the hub extra

        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=tokens,
            attention_dropout=0.0,
            pad_token_id=None,
            # KerasHub's LlamaBackbone.get_config leaves tie_word_embeddings out, so its port
            # built again from its config is untied: untied on both sides here
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
        )
        # the causal LM, whose files KerasHub's converter reads; its lm_head is not used here
        self.llama = transformers.LlamaForCausalLM(config)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        ids = x.flatten(1).to(torch.long)
        hidden = self.llama.model(input_ids=ids).last_hidden_state
        return self.head(hidden.mean(dim=1))


def llama(width=32, layers=2, heads=4, classes=10):
    return LlamaClassifier(width, layers, heads, classes=classes)


def to_keras_hub(module, **overrides):
    """KerasHub's Llama converter on the module's ``save_pretrained`` folder, with the same pool
    and head (``overrides``: backbone settings given to ``from_preset`` over the converted
    ones)."""
    import keras
    import keras_hub

    with tempfile.TemporaryDirectory() as folder:
        module.llama.save_pretrained(folder)
        backbone = keras_hub.models.LlamaBackbone.from_preset(folder, **overrides)
    pixels = keras.Input((8, 8, 1))
    ids = keras.ops.cast(keras.ops.reshape(pixels, (-1, 64)), "int32")
    hidden = backbone({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)})
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    head = keras.layers.Dense(module.head.out_features, name="head")
    out = head(pooled)
    head.set_weights([module.head.weight.detach().numpy().T, module.head.bias.detach().numpy()])
    return keras.Model(pixels, out)


def to_keras_hub_eps(module):
    """A converter with a mistake: RMSNorm's epsilon 1e-5 where the module's is 1e-6."""
    return to_keras_hub(module, layer_norm_epsilon=1e-5)


def to_keras_hub_rotary_interleaved(module):
    """A converter with a classic mistake: q's and k's features reordered within each head
    (evens, then odds), as a converter does for Meta's original checkpoints, whose rotary
    embedding turns interleaved pairs (2i, 2i + 1); Hugging Face's model here already turns
    half-split pairs (i, i + head size / 2), as KerasHub's does."""
    import numpy as np

    net = to_keras_hub(module)
    # (KerasHub names Llama 3's backbone llama3_backbone)
    backbone = next(la for la in net.layers if la.name.startswith("llama"))
    for block in range(module.llama.config.num_hidden_layers):
        attention = backbone.get_layer(f"transformer_layer_{block}")._self_attention_layer
        for dense in (attention._query_dense, attention._key_dense):
            (kernel,) = dense.get_weights()  # (hidden, heads, head size)
            size = kernel.shape[-1]
            dense.set_weights([kernel[..., np.r_[0:size:2, 1:size:2]]])
    return net
