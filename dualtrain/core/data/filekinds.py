"""What a data file or folder is, for the one-line error that names it (docs/data.md).

dualtrain reads an ``.npz`` file or a folder of ``.npy`` files (``dataset: arrays``) and a CSV or
Parquet table (``dataset: table``). Anything else given as ``data.path`` (a pickle, a JSON or text
file, an image or a folder of them, a spreadsheet, ...) is named as what it is, by its first bytes
and then its suffix, with what to do instead. Nothing here decodes a file.
"""

from __future__ import annotations

from pathlib import Path

#: a table's format by suffix (pandas infers the compression from a second suffix)
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

#: kind -> (what it is, what to do); {arrays} and {table} name the right dataset settings
KINDS: dict[str, tuple[str, str]] = {
    "npz": ("an .npz file of arrays", "use data.dataset: arrays"),
    "npy": (
        "one .npy array",
        "use data.dataset: arrays with an .npz file or a folder of .npy files",
    ),
    "npy folder": ("a folder of .npy arrays", "use data.dataset: arrays"),
    "csv": ("a CSV table", "use data.dataset: table, with data.target naming the target column"),
    "tsv": ("a TSV table", "use data.dataset: table, with data.target naming the target column"),
    "parquet": (
        "a Parquet table",
        "use data.dataset: table, with data.target naming the target column",
    ),
    "pickle": (
        "a pickle, which dualtrain never loads (loading one can run any code)",
        "save the arrays with numpy.savez, or the table with DataFrame.to_parquet",
    ),
    "torch": (
        "a PyTorch file (torch.save: a pickle), which dualtrain never loads",
        "save the tensors as NumPy arrays with numpy.savez (x_train, y_train, x_test, y_test)",
    ),
    "json": (
        "a JSON file",
        "save the data as a CSV or Parquet table (dataset: table) or as arrays with numpy.savez "
        "(dataset: arrays)",
    ),
    "text": (
        "a text file",
        "a CSV table needs the .csv suffix (.tsv: tab-separated) and a header row; use "
        "data.dataset: table",
    ),
    "image": (
        "an image",
        "stack the images into arrays: x_train.npy (N, C, H, W) and y_train.npy (N,) labels, "
        "likewise _test, in one folder (dataset: arrays)",
    ),
    "excel": ("an Excel workbook", "save the sheet as CSV or Parquet and use data.dataset: table"),
    "feather": (
        "an Arrow/Feather file",
        "save it as Parquet (DataFrame.to_parquet) and use data.dataset: table",
    ),
    "hdf5": ("an HDF5 file", "save its arrays with numpy.savez and use data.dataset: arrays"),
    "zip": ("a zip archive that is not an .npz", "unpack it and name the data file itself"),
    "gzip": ("a gzip file", "unpack it (a .csv.gz table is read as it is)"),
    "unknown": (
        "not a file type dualtrain reads",
        "give an .npz file or a folder of .npy files (dataset: arrays), or a .csv or .parquet "
        "table (dataset: table)",
    ),
}

_MAGIC = (
    (b"\x93NUMPY", "npy"),
    (b"PAR1", "parquet"),
    (b"\x89HDF", "hdf5"),
    (b"\x89PNG", "image"),
    (b"\xff\xd8\xff", "image"),
    (b"GIF8", "image"),
    (b"ARROW1", "feather"),
    (b"\x1f\x8b", "gzip"),
)
_SUFFIXES = {
    **{s: "pickle" for s in (".pkl", ".pickle", ".joblib")},
    **{s: "torch" for s in (".pt", ".pth", ".ckpt")},
    **{s: "json" for s in (".json", ".jsonl", ".ndjson")},
    **{s: "image" for s in IMAGE_SUFFIXES},
    **{s: "excel" for s in (".xlsx", ".xls", ".xlsm", ".ods")},
    **{s: "feather" for s in (".feather", ".arrow")},
    **{s: "hdf5" for s in (".h5", ".hdf5", ".hdf", ".keras")},
    ".npz": "npz",
    ".npy": "npy",
}


def table_format(path: Path) -> str | None:
    """``csv``, ``tsv`` or ``parquet`` by the name (``iris.csv``, ``iris.csv.gz``, ``x.parquet``),
    else None."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if len(suffixes) == 2 and suffixes[1] in COMPRESSED:
        suffixes = suffixes[:1]
    return TABLE_SUFFIXES.get(suffixes[-1]) if suffixes else None


def file_kind(path: Path) -> str:
    """What the file at ``path`` is (a key of KINDS), by its first bytes, then its name."""
    with open(path, "rb") as f:
        head = f.read(4096)
    suffix = path.suffix.lower()
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return (table_format(path) or kind) if kind == "gzip" else kind
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # a zip: .npz, .xlsx, torch.save, .csv.zip
        return table_format(path) or _SUFFIXES.get(suffix, "npz" if suffix == ".npz" else "zip")
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if table_format(path) is not None:
        return str(table_format(path))
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    return "text" if _is_text(head) else "unknown"


def _is_text(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut at the end is still text
        return exc.start >= len(head) - 3
    return True


def folder_kind(path: Path) -> tuple[str, str]:
    """What the folder at ``path`` holds: (a key of KINDS, the words that say it)."""
    files = [f for f in path.iterdir() if not f.name.startswith(".")]
    if any(f.suffix == ".npy" for f in files):
        return "npy folder", KINDS["npy folder"][0]
    images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
    if images:
        return "image", f"a folder of {len(images)} image(s) ({images[0].name}, ...)"
    subfolders = [f for f in files if f.is_dir()]
    if subfolders and any(
        g.suffix.lower() in IMAGE_SUFFIXES for d in subfolders[:5] for g in d.iterdir()
    ):
        return "image", (
            f"a folder of image folders ({subfolders[0].name}/, ...: torchvision's ImageFolder "
            "layout)"
        )
    tables = [f for f in files if table_format(f) is not None]
    if tables:
        return "table folder", f"a folder of tables ({tables[0].name}, ...)"
    if not files:
        return "empty", "an empty folder"
    return "unknown", "a folder without .npy files"


def refusal(path: Path, where: str, want: str) -> str:
    """The one line that says ``data.path`` is not what ``want`` (``arrays`` or ``table``) reads:
    what it is and what to do."""
    if path.is_dir():
        kind, what = folder_kind(path)
        todo = {
            "npy folder": KINDS["npy folder"][1],
            "image": KINDS["image"][1],
            "table folder": "name one table file as data.path (and the test split's as "
            "data.test_path) with data.dataset: table",
        }.get(kind, KINDS["unknown"][1])
    else:
        kind = file_kind(path)
        what, todo = KINDS[kind]
    return f"data.path is {what}: {todo} (docs/data.md). Received: data.path={where!r}"


def reads(kind: str, want: str) -> bool:
    """Whether ``dataset: {want}`` reads a file of this kind (an unknown one is tried as an .npz,
    whose reader then names the problem)."""
    if want == "table":
        return kind in ("csv", "tsv", "parquet")
    return kind in ("npz", "zip")
