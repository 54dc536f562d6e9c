"""A run's model pair layout from the two sides' descriptions: the map file when
``model.weight_map`` names one, else the automatic match; complete either way; and the two sides'
dropout calls matched in forward order (:mod:`.dropout`)."""

from __future__ import annotations

from dualtrain.core.pair import dropout
from dualtrain.core.pair.mapfile import check_complete, load_map_file
from dualtrain.core.pair.match import match
from dualtrain.core.pair.record import Layout, Side
from dualtrain.errors import UserError

#: torch modules whose weights no layout transform maps one to one onto a Keras port, and why
PACKED = {
    "MultiheadAttention": (
        "its query, key and value projections are packed in one in_proj_weight (3E x E), where "
        "Keras's MultiHeadAttention keeps a kernel per projection (E x heads x head_dim)"
    ),
}


def check_mappable(torch: Side) -> None:
    """Refuse, in one line, a torch module the weight map cannot carry yet (PACKED)."""
    for a in torch.torch:
        why = PACKED.get(a.cls)
        if why is not None:
            raise UserError(
                f"model pair: torch {a.module or 'the model'!r} is an nn.{a.cls}: {why}; a "
                f"model pair cannot map it yet (attention in a pair comes with the transformer "
                f"layers; dualtrain's own model.layers have no attention either). Received: "
                f"{a.name} {list(a.shape)}"
            )


def layout(torch: Side, keras: Side, weight_map: str | None) -> Layout:
    check_mappable(torch)
    if weight_map is not None:
        entries = load_map_file(weight_map, torch, keras)
    else:
        entries = match(torch, keras)
        check_complete(entries, torch, keras)
    drops = dropout.match(torch.dropouts, keras.dropouts)
    return Layout(torch, keras, entries, explicit=weight_map is not None, dropouts=drops)
