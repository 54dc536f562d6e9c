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
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

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
    """mnist, arrays (your own .npz or .npy folder at ``path``), table (your own CSV or Parquet
    file at ``path``), or a dataset bundled with scikit-learn: digits, wine, breast_cancer, diabetes
    (docs/data.md)."""
    path: str | None = tagged_field(COSMETIC, FREE, default=None)
    """arrays: an .npz file or a folder of .npy files holding ``{input}_train``, ``{input}_test``,
    ``{target}_train`` and ``{target}_test`` (.npy files are memory-mapped). table: a .csv (.tsv,
    .csv.gz) or .parquet file with a header row, one sample a row. Its content's sha256 is what the
    run records and resume and continuation check, not the path."""
    target: str = "y"
    """arrays: the target's name (its arrays are ``{target}_train`` and ``{target}_test``). table:
    the target column's name."""
    columns: dict[str, list[str]] = field(default_factory=dict)
    """table: each model input's columns, ``{x: [c1, c2, ...]}``, in that order. Empty: the
    model's one input takes every column but the target, in the table's order."""
    test_path: str | None = tagged_field(COSMETIC, FREE, default=None)
    """table: the test split, a second table with the same columns (or give ``test_fraction``)."""
    test_fraction: float | None = None
    """table: the test split drawn from the table's rows, a fraction in (0, 1): that many rows by a
    permutation of the seed, identical on both backends (or give ``test_path``)."""
    normalize: Normalize = Normalize.AUTO
    """auto: every input as (x - mean) / std per channel (images) or feature (tables), the values
    from ``stats`` where given, else computed once from the training split (validation excluded)
    and recorded in the run (MNIST: its usual (x / 255 - 0.1307) / 0.3081); none: inputs as stored,
    as float32."""
    stats: tuple[InputStats, ...] = ()
    """Given mean/std per input, e.g. ``[{input: x, mean: [0.5], std: [0.25]}]``."""
    validation: float | None = None
    """A validation split taken from the training split by ids: a fraction in (0, 1) (that many
    samples, drawn by a permutation of the seed, identical on both backends), or give
    ``validation_ids``. Evaluated beside the test split; never trained on."""
    validation_ids: tuple[int, ...] = ()
    """Explicit validation sample ids (rows of the training split); ``validation: [ids...]`` in a
    spec means the same."""
    data_dir: str | None = tagged_field(COSMETIC, FREE, default=None)
    """mnist: a folder with the canonical MNIST files (IDX, gzipped or not, or mnist.npz). None:
    offline copy or cache."""
    download: bool = tagged_field(COSMETIC, FREE, default=True)
    """mnist: allow a checksum-verified download into the cache when no local copy is found."""
    batch_size: int = 128
    """Global batch size (all replicas together) of one forward and backward: with
    train.accumulate K, an optimizer step takes K such micro-batches (K * batch_size samples)."""
    eval_batch_size: int = 1000
    """Global batch size for evaluation."""
    shuffle: bool = True
    """Shuffle the training order every epoch (permutation from seed and epoch)."""
    last_batch: LastBatch = LastBatch.KEEP
    """What to do with a partial last global batch: keep it (split across replicas) or drop it."""
    sharding: Sharding = Sharding.EXACT
    """How a global batch is split: ``exact`` (no duplicates) or ``torch_sampler``
    (DistributedSampler)."""
    train_limit: int | None = None
    """Use only the first N training samples (quick runs and tests); a validation split is taken
    from these N."""
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
