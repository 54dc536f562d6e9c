"""A run's model pair layout from the two sides' descriptions: the map learned from a converter
(model.convert), the map file when ``model.weight_map`` names one, else the automatic match;
complete either way; and the two sides'
dropout calls matched in forward order (:mod:`.dropout`)."""

from __future__ import annotations

from dualtrain.core.pair import dropout
from dualtrain.core.pair.mapfile import check_complete, load_map_file
from dualtrain.core.pair.match import match
from dualtrain.core.pair.record import Layout, MapEntry, Side


def layout(
    torch: Side, keras: Side, weight_map: str | None, learned: tuple[MapEntry, ...] | None = None
) -> Layout:
    """``learned``: a converted pair's map (dualtrain.core.pair.learn.entries)."""
    if learned is not None:
        entries = learned
        check_complete(entries, torch, keras)
    elif weight_map is not None:
        entries = load_map_file(weight_map, torch, keras)
    else:
        entries = match(torch, keras)
        check_complete(entries, torch, keras)
    drops = dropout.match(torch.dropouts, keras.dropouts)
    return Layout(
        torch,
        keras,
        entries,
        explicit=weight_map is not None,
        dropouts=drops,
        learned=learned is not None,
    )
