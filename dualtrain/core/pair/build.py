"""A run's model pair layout from the two sides' descriptions: the map learned from a converter
(model.convert), the map file when ``model.weight_map`` names one, else the automatic match;
complete either way; and the two sides'
dropout calls matched in forward order (:mod:`.dropout`)."""

from __future__ import annotations

from dualtrain.core.pair import dropout
from dualtrain.core.pair.mapfile import check_complete, load_map_file
from dualtrain.core.pair.match import match
from dualtrain.core.pair.record import Layout, MapEntry, Side
from dualtrain.errors import UserError


def layout(
    torch: Side, keras: Side, weight_map: str | None, learned: tuple[MapEntry, ...] | None = None
) -> Layout:
    """``learned``: a converted pair's map (dualtrain.core.pair.learn.entries)."""
    if learned is not None:
        entries = learned
        _same_port(entries, keras)
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


def _same_port(entries: tuple[MapEntry, ...], keras: Side) -> None:
    """The port built again from its config (the TF side's) holds the variables the converter's
    port held (the map's): one line where its get_config loses something the converter set."""
    mapped = {k for e in entries for k in e.targets}
    built = {v.path for v in keras.keras}
    if mapped != built:
        extra, lost = sorted(built - mapped), sorted(mapped - built)
        raise UserError(
            "model.convert: the Keras model built again from its config (model.to_json()) has "
            "other variables than the one the converter returned ("
            + (f"new: {extra[:3]}" if extra else f"gone: {lost[:3]}")
            + "): its get_config does not keep everything the converter set"
        )
