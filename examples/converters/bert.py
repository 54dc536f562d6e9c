"""Hugging Face's BERT and its KerasHub port, made by KerasHub's own converter
(configs/converted_bert.yaml): ``transformers.BertModel`` with a mean-pool over its last hidden
state and a Linear head; the converter saves the BERT with ``save_pretrained`` and builds
``keras_hub.models.BertBackbone.from_preset`` on that folder (offline), with the same pool and
head. Each 8x8 digit is read as 64 tokens (its pixel values 0..16), one segment, no padding.
Both keep BERT's pooler (a dense layer on the first token), which the head does not use.

Two differences between Hugging Face's BERT and KerasHub's, both found by dualtrain on this pair:
KerasHub's BertBackbone computes gelu in its tanh form whatever ``hidden_act`` says (Hugging
Face's default, "gelu", is the exact form), and its converter does not read the dropout rates.
So this pair's torch side asks for the tanh form (``gelu_new``) and the converter passes the
rate; ``bert_exact_gelu`` and ``to_keras_hub_as_is`` keep each difference, and dualtrain names it.
The padding id is one no sample holds: Hugging Face's embedding keeps its row fixed
(``padding_idx``), KerasHub's trains it.

    dualtrain compare --config configs/converted_bert.yaml

Needs the ``hub`` extra (transformers, keras-hub).
"""

import tempfile

import torch
from torch import nn


class BertClassifier(nn.Module):
    """Token ids (N, 64) -> BERT -> the mean over the tokens -> Linear."""

    def __init__(
        self, width=32, layers=2, heads=4, classes=10, tokens=64, vocab=17, act="gelu_new"
    ):
        super().__init__()
        import transformers  # the hub extra

        config = transformers.BertConfig(
            vocab_size=vocab + 1,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            max_position_embeddings=tokens,
            hidden_act=act,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=vocab,  # an id no sample holds: see to_keras_hub
        )
        self.bert = transformers.BertModel(config)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        ids = x.flatten(1).to(torch.long)
        hidden = self.bert(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        return self.head(hidden.mean(dim=1))


def bert(width=32, layers=2, heads=4, classes=10):
    """BERT with the tanh form of gelu (``gelu_new``), the form KerasHub's BertBackbone computes
    whatever the checkpoint's ``hidden_act`` says."""
    return BertClassifier(width, layers, heads, classes)


def bert_exact_gelu(width=32, layers=2, heads=4, classes=10):
    """BERT as Hugging Face's BertConfig builds it by default: ``hidden_act="gelu"``, the exact
    (erf) form; KerasHub's converter gives it the tanh form, and dualtrain names that layer."""
    return BertClassifier(width, layers, heads, classes, act="gelu")


def to_keras_hub(module, dropout=True):
    """KerasHub's BERT converter on the module's ``save_pretrained`` folder, with the same pool
    and head. KerasHub's converter does not read Hugging Face's dropout rates
    (``hidden_dropout_prob``): its backbone keeps its own default, 0.1, so the rate is given to
    ``from_preset`` here (``to_keras_hub_as_is`` leaves it out, and dualtrain names it)."""
    import keras
    import keras_hub

    rate = {"dropout": module.bert.config.hidden_dropout_prob} if dropout else {}
    with tempfile.TemporaryDirectory() as folder:
        module.bert.save_pretrained(folder)
        backbone = keras_hub.models.BertBackbone.from_preset(folder, **rate)
    pixels = keras.Input((8, 8, 1))
    ids = keras.ops.cast(keras.ops.reshape(pixels, (-1, 64)), "int32")
    hidden = backbone(
        {
            "token_ids": ids,
            "segment_ids": keras.ops.zeros_like(ids),
            "padding_mask": keras.ops.ones_like(ids),
        }
    )["sequence_output"]
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    head = keras.layers.Dense(module.head.out_features, name="head")
    out = head(pooled)
    head.set_weights([module.head.weight.detach().numpy().T, module.head.bias.detach().numpy()])
    return keras.Model(pixels, out)


def to_keras_hub_as_is(module):
    """KerasHub's converter as it is: its dropout rate is its own default, not the module's."""
    return to_keras_hub(module, dropout=False)
