"""The run directory contract, written by the chief replica and read by compare and the tests.

Files (see docs/run-directory.md):

- ``spec.yaml``: the resolved spec.
- ``metrics.jsonl``: one JSON object per line. ``kind: train`` lines (step, epoch, loss, lr,
  grad_norm, loss_scale, skipped, samples, samples_per_s) and ``kind: eval`` lines (step, epoch,
  loss, accuracy, count). ``step`` is the 1-based global step, ``epoch`` 1-based.
- ``shards.jsonl``: per step and replica: step, epoch, replica, digest (of the ids actually fed),
  count.
- ``summary.json``: backend, world_size, precision, steps, wall_s, train_samples_per_s, test_loss,
  test_accuracy, versions and more.
- ``weights_init.npz`` / ``weights_final.npz``: canonical layout (dualtrain.core.model).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dualtrain.errors import UserError
from dualtrain.jsonio import json_safe, write_atomic
from dualtrain.records.tbevents import EventLog

SPEC_FILE = "spec.yaml"
METRICS_FILE = "metrics.jsonl"
SHARDS_FILE = "shards.jsonl"
SUMMARY_FILE = "summary.json"
WEIGHTS_INIT = "weights_init.npz"
WEIGHTS_FINAL = "weights_final.npz"
#: train.keep_best: the weights of the best evaluation (train.early_stopping's metric)
WEIGHTS_BEST = "weights_best.npz"
#: train.ema: the averaged weights at the end (with the live batchnorm statistics)
WEIGHTS_EMA = "weights_ema.npz"
#: For a loss on class labels: whether each test sample was predicted right (uint8, in the test
#: split's order) at the run's latest evaluation; the convergence check pairs it with the fp64 run's
TEST_CORRECT = "test_correct.npy"


#: debug.dump_layers: ``layers_step{N}.npz``, every layer's output at step N (parity/taps.py)
LAYERS_PREFIX, LAYERS_SUFFIX = "layers_step", ".npz"


def layers_file(step: int) -> str:
    return f"{LAYERS_PREFIX}{step}{LAYERS_SUFFIX}"


def as_float(value: Any) -> float:
    return float(value)  # float() reads "nan", "inf" and "-inf" too


class RunWriter:
    """Append-only writer for metrics.jsonl and shards.jsonl (one process: the chief)."""

    def __init__(self, run_dir: str | Path, append: bool = False, tensorboard: bool = False):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self._metrics = open(self.dir / METRICS_FILE, mode, buffering=1)
        self._shards = open(self.dir / SHARDS_FILE, mode, buffering=1)
        self._events = None
        if tensorboard:
            self._events = EventLog(self.dir)

    def offsets(self) -> dict[str, int]:
        """Bytes written so far to each record file, TensorBoard's event files included (a
        checkpoint remembers them; a resume cuts the files back to them and deletes event files
        written after them, dualtrain.driver.rewind.truncate_records)."""
        self.flush()
        sizes = {METRICS_FILE: self._metrics.tell(), SHARDS_FILE: self._shards.tell()}
        if self._events is not None:
            sizes.update(self._events.sizes(self.dir))
        return sizes

    def train(self, **fields: Any) -> None:
        self._write(self._metrics, {"kind": "train", **fields})
        if self._events is not None:
            self._events.train(fields)

    def eval(self, **fields: Any) -> None:
        self._write(self._metrics, {"kind": "eval", **fields})
        if self._events is not None:
            self._events.eval(fields)

    def shard(
        self,
        *,
        step: int,
        epoch: int,
        replica: int,
        digest: str,
        count: int,
        micro: list[int] | None = None,
    ) -> None:
        """``micro``: with train.accumulate, the replica's micro-batch sizes in order (its ids,
        in the order ``digest`` hashes them, cut into these contiguous pieces)."""
        row: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "replica": replica,
            "digest": digest,
            "count": count,
        }
        if micro is not None:
            row["micro"] = micro
        self._write(self._shards, row)

    def summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.dir / SUMMARY_FILE, json.dumps(json_safe(summary), indent=2) + "\n")

    def flush(self) -> None:
        self._metrics.flush()
        self._shards.flush()
        if self._events is not None:
            self._events.flush()

    def close(self) -> None:
        self._metrics.close()
        self._shards.close()
        if self._events is not None:
            self._events.close()

    @staticmethod
    def _write(f: Any, obj: dict[str, Any]) -> None:
        f.write(json.dumps(json_safe(obj)) + "\n")


@dataclass
class RunRecord:
    path: Path
    spec: dict[str, Any]
    train: list[dict[str, Any]] = field(default_factory=list)
    eval: list[dict[str, Any]] = field(default_factory=list)
    shards: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise UserError(f"{path}:{n}: not valid JSON") from None
    return rows


def read_run(run_dir: str | Path, *, require_summary: bool = True) -> RunRecord:
    """Load a finished run directory (UserError if it is not one)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise UserError(f"run directory not found: {str(d)!r}")
    for name in (SPEC_FILE, METRICS_FILE, SHARDS_FILE) + (
        (SUMMARY_FILE,) if require_summary else ()
    ):
        if not (d / name).is_file():
            raise UserError(f"{d} is not a finished dualtrain run directory (no {name})")
    spec = yaml.safe_load((d / SPEC_FILE).read_text()) or {}
    metrics = _read_jsonl(d / METRICS_FILE)
    summary = json.loads((d / SUMMARY_FILE).read_text()) if (d / SUMMARY_FILE).is_file() else {}
    return RunRecord(
        path=d,
        spec=spec,
        train=[m for m in metrics if m.get("kind") == "train"],
        eval=[m for m in metrics if m.get("kind") == "eval"],
        shards=_read_jsonl(d / SHARDS_FILE),
        summary=summary,
    )


def step_map(
    rec: RunRecord, key: str, kind: str = "train", *, present: bool = False
) -> dict[int, float]:
    """``key`` per step (NaN where a row lacks it; ``present``: only the rows that have it)."""
    rows = rec.train if kind == "train" else rec.eval
    out: dict[int, float] = {}
    for r in rows:
        if "step" not in r or (present and key not in r):
            continue
        v = r.get(key)
        out[int(r["step"])] = as_float(v) if v is not None else math.nan
    return out
