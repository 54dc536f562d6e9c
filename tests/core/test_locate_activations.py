"""The locator's activation findings (dualtrain.core.locate.mistakes) name what each side applies,
including torch activations held as functions (nn.TransformerEncoderLayer's F.relu / F.gelu), which
the torch backend probes as ``act/<module>.activation``: issue 46 item 3 ("torch uses -")."""

from __future__ import annotations

from dualtrain.core.locate.mistakes import (
    ACTIVATION_PROBE,
    ACTIVATIONS,
    activation_mistake,
    layer_mistake,
)
from dualtrain.core.pair import Layout

EXACT, TANH = ACTIVATIONS["gelu (exact, erf)"], ACTIVATIONS["gelu (tanh approximation)"]


def test_torch_gelu_held_as_a_function_is_named_against_keras_tanh_gelu():
    t = {"act/blocks.0.activation": EXACT(ACTIVATION_PROBE)}
    k = {"act/gelu": TANH(ACTIVATION_PROBE)}
    said = activation_mistake(t, k)
    assert "torch uses gelu (exact, erf)" in said and "Keras gelu (tanh approximation)" in said
    assert "-" not in said.split("torch uses ")[1].split(",")[0]


def test_an_activation_inside_a_keras_layer_is_named_against_torchs():
    side = {"factory": "f", "output": [10], "torch": [], "keras": []}
    keras = {**side, "layers": [{"name": "dense_2", "activation": "gelu"}]}
    layout = Layout.from_json({"torch": side, "keras": keras, "map": []})
    t = {"act/blocks.0.activation": ACTIVATIONS["relu"](ACTIVATION_PROBE)}
    said = layer_mistake(layout, "blocks.0.linear1", "dense_2", "dense", t, {}, {})
    assert said == (
        "a different activation: the Keras layer applies gelu, torch relu at blocks.0.activation"
    )
    # where torch applies the same one (elsewhere), the finding stays the general one
    t = {"act/blocks.0.activation": EXACT(ACTIVATION_PROBE)}
    assert "that torch applies elsewhere" in layer_mistake(
        layout, "blocks.0.linear1", "dense_2", "dense", t, {}, {}
    )
