"""The data section: which dataset, its normalisation (given per input or computed), the
validation split, batch sizes, shuffling and how a global batch is sharded (frozen, keyword-only
dataclasses whose ``__post_init__`` range-checks every value with a one-line UserError)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualtrain.spec.fields import COSMETIC, FREE, SPEC_DATACLASS, check_field, tagged_field
from dualtrain.spec.vocab import Dataset, LastBatch, Normalize, Sharding


@dataclass(**SPEC_DATACLASS)
class InputStats:
    """Given normalisation values for one input: one mean and std per channel (images) or feature
    (tables), or one value for all."""

    input: str = "x"
    """The model input these values are for."""
    mean: tuple[float, ...] = ()
    """One value, or one per channel of an image or feature of a table."""
    std: tuple[float, ...] = ()
    """As many values as ``mean``, each finite and > 0."""

    def __post_init__(self) -> None:
        check_field(
            len(self.mean) >= 1 and len(self.mean) == len(self.std),
            f"data.stats[{self.input}]",
            "needs mean and std of the same length (>= 1)",
            {"mean": list(self.mean), "std": list(self.std)},
        )
        check_field(
            all(s > 0 and s < float("inf") for s in self.std),
            f"data.stats[{self.input}].std",
            "must be finite and > 0",
            list(self.std),
        )


@dataclass(**SPEC_DATACLASS)
class DataSpec:
    dataset: Dataset = Dataset.MNIST
    """mnist; arrays: your own .npz file or folder of .npy files at ``path``; table: your own CSV
    or Parquet table at ``path``, converted once into cached arrays. Or a dataset bundled inside
    scikit-learn's package: digits, wine, breast_cancer, diabetes. Every fifth sample of those is a
    test sample. docs/data.md."""
    path: str | None = tagged_field(COSMETIC, FREE, default=None)
    """For arrays and table: required there, refused elsewhere. arrays: an .npz file or a folder
    of .npy files. It holds ``{input}_train``, ``{input}_test``, ``{target}_train`` and
    ``{target}_test`` for every model input and the target. The .npy files are memory-mapped, an
    .npz is read into memory, and no pickle is loaded. table: a .csv, .tsv, .csv.gz or .parquet
    file with a header row, one sample a row. The run records and checks the content's sha256,
    not the path: a resume may name another path to the same content. Another kind of file is
    named as what it is, with what to do."""
    target: str = "y"
    """arrays: the target's name; its arrays are ``{target}_train`` and ``{target}_test``. table:
    the target column, of any name. Text or categorical labels become classes 0..K-1, sorted or in
    the category order. The run records the class names.
    docs/data.md#your-own-table-csv-or-parquet."""
    columns: dict[str, list[str]] = field(default_factory=dict)
    """table: each model input's columns, in order: ``{x: [c1, c2]}``. Empty: the one model input
    takes every column but the target, in the table's order. Input columns must be numeric,
    stored as float32, every value finite."""
    test_path: str | None = tagged_field(COSMETIC, FREE, default=None)
    """table: the test split, a second table with the same columns. Not with ``test_fraction``."""
    test_fraction: float | None = None
    """table: the test split as a fraction in (0, 1) of the rows. That is ``round(fraction * n)``
    rows, drawn by a permutation of the seed, identical on both backends. The training split is
    the other rows, in order. Not with ``test_path``."""
    normalize: Normalize = Normalize.AUTO
    """auto: every input as ``(x - mean) / std`` per channel of an image or feature of a table.
    The values are ``stats`` where given. Else they are computed once from the training split,
    validation excluded, in float64 and applied in float32. MNIST takes its usual
    ``(x / 255 - 0.1307) / 0.3081``. none: the stored values as float32. Recorded in the run's
    data.json."""
    stats: tuple[InputStats, ...] = ()
    """Given mean and std per input, used instead of computed ones:
    ``[{input: x, mean: [0.5], std: [0.25]}]``. One value, or one per channel or feature. They
    apply to the stored values. Not with ``normalize: none``."""
    validation: float | None = None
    """A validation split taken from the training split by ids. A fraction in (0, 1):
    ``round(fraction * n)`` samples drawn by a permutation of the seed, identical on both backends.
    Or a list of ids, the same as ``validation_ids``. Never trained on. Evaluated with the test
    split at every evaluation. docs/data.md#the-validation-split."""
    validation_ids: tuple[int, ...] = ()
    """Explicit validation ids: rows of the training split after ``train_limit``, distinct, >= 0.
    Not with a ``validation`` fraction. ``validation: [ids...]`` in a spec means the same."""
    data_dir: str | None = tagged_field(COSMETIC, FREE, default=None)
    """mnist: a folder with the canonical MNIST files: IDX, gzipped or not, or mnist.npz. null:
    the offline copy or the cache."""
    download: bool = tagged_field(COSMETIC, FREE, default=True)
    """mnist: allow a checksum-verified download into the cache when no local copy is found."""
    batch_size: int = 128
    """Global batch size of one forward and backward, all replicas together. With
    ``train.accumulate: K`` an optimizer step takes K such micro-batches."""
    eval_batch_size: int = 1000
    """Global batch size for evaluation."""
    shuffle: bool = True
    """Shuffle the training order every epoch, a permutation from the seed and the epoch."""
    last_batch: LastBatch = LastBatch.KEEP
    """What to do with a partial last global batch: keep it, split across replicas, or drop it."""
    sharding: Sharding = Sharding.EXACT
    """How a global batch is split. exact: every sample once, no duplicates. torch_sampler:
    torch's DistributedSampler, padding and rank striding included. torch_sampler needs a batch
    size that is a multiple of the world size, and no ``train.accumulate``."""
    train_limit: int | None = None
    """Use only the first N training samples, for quick runs and tests. A validation split is
    taken from these N."""
    test_limit: int | None = None
    """Use only the first N test samples."""

    def __post_init__(self) -> None:
        check_field(self.batch_size >= 1, "data.batch_size", "must be >= 1", self.batch_size)
        check_field(
            self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1", self.eval_batch_size
        )
        for name in ("train_limit", "test_limit"):
            v = getattr(self, name)
            check_field(v is None or v >= 1, f"data.{name}", "must be >= 1 or null", v)
        if self.dataset is Dataset.ARRAYS:
            check_field(
                bool(self.path),
                "data.path",
                "must name an .npz file or a folder of .npy files with dataset: arrays",
                self.path,
            )
        elif self.dataset is Dataset.TABLE:
            check_field(
                bool(self.path),
                "data.path",
                "must name a .csv or .parquet file with dataset: table",
                self.path,
            )
        else:
            check_field(
                self.path is None,
                "data.path",
                "is only for dataset: arrays or table",
                self.path,
            )
        self._check_table()
        if self.validation is not None:
            check_field(
                0.0 < self.validation < 1.0,
                "data.validation",
                "must be a fraction in (0, 1) or a list of sample ids",
                self.validation,
            )
            check_field(
                not self.validation_ids,
                "data.validation_ids",
                "cannot be given with a validation fraction",
                list(self.validation_ids),
            )
        ids = self.validation_ids
        check_field(
            all(i >= 0 for i in ids) and len(set(ids)) == len(ids),
            "data.validation_ids",
            "must be distinct ids >= 0",
            list(ids)[:10],
        )
        names = [s.input for s in self.stats]
        check_field(len(set(names)) == len(names), "data.stats", "names an input twice", names)
        check_field(
            not self.stats or self.normalize is Normalize.AUTO,
            "data.stats",
            "gives normalisation values, which data.normalize: none turns off; drop one",
            names,
        )

    def _check_table(self) -> None:
        """The table fields: a target column, the inputs' columns, one test split."""
        if self.dataset is not Dataset.TABLE:
            check_field(
                self.target.isidentifier(), "data.target", "must be an identifier", self.target
            )
            for name in ("columns", "test_path", "test_fraction"):
                value = getattr(self, name)
                check_field(not value, f"data.{name}", "is only for dataset: table", value)
            return
        check_field(bool(self.target), "data.target", "must name the target column", self.target)
        for name, cols in self.columns.items():
            check_field(
                name.isidentifier()
                and isinstance(cols, list)
                and bool(cols)
                and all(isinstance(c, str) and c for c in cols),
                f"data.columns[{name}]",
                "must map a model input to a list of column names, e.g. {x: [c1, c2]}",
                cols,
            )
            check_field(
                len(set(cols)) == len(cols), f"data.columns[{name}]", "names a column twice", cols
            )
            check_field(
                self.target not in cols,
                f"data.columns[{name}]",
                f"names the target column {self.target!r} as an input",
                cols,
            )
        check_field(
            (self.test_path is None) != (self.test_fraction is None),
            "data.dataset table",
            "needs one test split: data.test_fraction (a fraction of its rows) or data.test_path "
            "(a second table), not both",
            {"test_fraction": self.test_fraction, "test_path": self.test_path},
        )
        if self.test_fraction is not None:
            check_field(
                0.0 < self.test_fraction < 1.0,
                "data.test_fraction",
                "must be a fraction in (0, 1)",
                self.test_fraction,
            )
