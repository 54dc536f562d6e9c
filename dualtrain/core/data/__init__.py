"""The run's data, whatever its source, as both backends consume it (docs/data.md).

:func:`open_data` gives a :class:`Data`: three splits (train, an optional validation split taken
from the training rows by ids, test), each a list of row ids into the stored arrays (memory-mapped
where they are .npy files), and one :class:`Transform` per input. A step asks for its rows
(:meth:`Data.inputs`, :meth:`Data.targets`): the same ids give the same float32 arrays on both
backends, computed here once, so neither framework normalises or casts anything itself (fp64 runs
widen these float32 values exactly).

Sources: MNIST (:mod:`dualtrain.core.data.mnist`, content pinned), your arrays
(:mod:`dualtrain.core.data.arrays`), your table (:mod:`.tables`, converted once into cached arrays),
scikit-learn's bundled datasets (:mod:`dualtrain.core.data.bundled`,
content pinned). The sample ids the plan deals in are positions in the training split: with no
validation split and no limit they are the rows.

Modules:

* ``dataset``: the :class:`Data` a run reads its steps from, :func:`open_data`, its data.json;
* ``splits``: the train / validation / test splits as row ids, the validation split's seed;
* ``transforms``: each input's normalisation (:class:`Transform`), its statistics, MNIST's;
* ``sources``: where the data comes from, its stored arrays, their shapes against the model;
* ``tables``: a CSV or Parquet table (or a DataFrame) checked and converted into arrays;
* ``tablecache``: those arrays written once into the cache (and the Python API's in-memory data);
* ``checks``: :func:`check`, the driver's one check of the data's content against the model.

The names other modules use as ``data.<name>`` are re-exported here.
"""

from dualtrain.core.data.checks import check
from dualtrain.core.data.dataset import Data, open_data
from dualtrain.core.data.sources import locate, stamp
from dualtrain.core.data.splits import TEST, TRAIN, VALIDATION, Split, validation_seed
from dualtrain.core.data.transforms import normalize

__all__ = [
    "TEST",
    "TRAIN",
    "VALIDATION",
    "Data",
    "Split",
    "check",
    "locate",
    "normalize",
    "open_data",
    "stamp",
    "validation_seed",
]
