"""A model pair: a PyTorch module and its Keras port, written by the user (``model.torch`` and
``model.keras``), and the weight map between them. Framework-free.

Each backend describes its own side in a child process (``python -m dualtrain.backends.<b>.pair``,
which imports the user's factory: :mod:`.factories`): the torch side lists its state dict (names,
shapes, which module, the module's kind) and the Keras side its variables (paths, shapes, which
layer, the layer's kind and, for a dense layer fed by a flatten, the H, W, C it flattens).
:func:`layout` then pairs them, here, once (:mod:`.match`, or the user's map file:
:mod:`.mapfile`): the map is the run's record (``model_pair.json``, :mod:`.record`) and both
backends read it. The canonical layout of a pair is the torch module's state dict (as for
dualtrain's own layers, docs/weights.md), less ``num_batches_tracked``; the TF backend converts
every array with the map's transform when it loads or exports weights (:mod:`.transforms`).

Modules:

* ``record``: each side's description, the map's entries, the Layout and ``model_pair.json``;
* ``transforms``: the layout transforms between the canonical (torch) layout and Keras's;
* ``attention``: nn.MultiheadAttention's packed projections against Keras's MultiHeadAttention;
* ``match``: the automatic map (weighted layers paired in order);
* ``mapfile``: the explicit map (``model.weight_map``'s file), and the completeness check;
* ``build``: a run's Layout from both sides, by the map file or the automatic match;
* ``factories``: importing and calling the user's factories, and checking what they build;
* ``dropout``: the sides' dropout calls matched in forward order, and their hash masks in a
  training forward;
* ``learn``: a weight map learned from values, where a converter builds the Keras side
  (``model.convert``: the torch backend's convert.py runs it; the map's entries are ``view``).

The names other modules use as ``pair.<name>`` are re-exported here.
"""

from dualtrain.core.pair.build import layout
from dualtrain.core.pair.factories import (
    call_factory,
    check_output,
    import_factory,
    import_path,
    source_digest,
)
from dualtrain.core.pair.mapfile import read_map_file
from dualtrain.core.pair.record import (
    CONVERTED_FILE,
    CUSTOM_OBJECTS_FILE,
    PAIR_FILE,
    PART,
    SKIPPED_BUFFERS,
    KerasVar,
    Layout,
    MapEntry,
    Side,
    TorchArray,
    ViewOf,
    map_from_json,
    map_json,
    read,
    side_from_json,
    write,
)
from dualtrain.core.pair.transforms import (
    is_split,
    join_canonical,
    keras_shape,
    keras_shapes,
    part_entry,
    split_canonical,
    to_canonical,
    to_canonical_parts,
    to_keras,
    to_keras_parts,
)

__all__ = [
    "CONVERTED_FILE",
    "CUSTOM_OBJECTS_FILE",
    "PAIR_FILE",
    "SKIPPED_BUFFERS",
    "KerasVar",
    "Layout",
    "PART",
    "MapEntry",
    "Side",
    "TorchArray",
    "ViewOf",
    "call_factory",
    "check_output",
    "import_factory",
    "import_path",
    "is_split",
    "join_canonical",
    "keras_shape",
    "keras_shapes",
    "part_entry",
    "layout",
    "map_from_json",
    "map_json",
    "read",
    "read_map_file",
    "side_from_json",
    "source_digest",
    "split_canonical",
    "to_canonical",
    "to_canonical_parts",
    "to_keras",
    "to_keras_parts",
    "write",
]
