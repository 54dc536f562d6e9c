"""TensorBoard event files from the framework-free core (``logging.tensorboard``).

The chief of either backend writes the same scalars under the same tags into RUN_DIR/tensorboard,
with the ``tensorboard`` package's own event writer (it imports no TensorFlow: a torch run stays
free of it). ``tensorboard --logdir RUN_DIR`` shows one run; on a ``dualtrain compare`` folder it
overlays torch, tf and the fp64 reference pair, one TensorBoard run per run directory.

The event files are records like metrics.jsonl: a checkpoint remembers their sizes and a resume cuts
them back (dualtrain.driver.rewind.truncate_records), so a resumed run shows every step once.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any

DIR = "tensorboard"

#: metrics.jsonl field -> TensorBoard tag, per record kind.
TRAIN_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "loss_scale": "train/loss_scale",
    "samples_per_s": "train/samples_per_s",
}
EVAL_TAGS = {
    "loss": "eval/loss",
    "accuracy": "eval/accuracy",
    "mae": "eval/mae",
    "val_loss": "validation/loss",
    "val_accuracy": "validation/accuracy",
    "val_mae": "validation/mae",
}


def available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class EventLog:
    """Scalars -> one event file in ``run_dir/tensorboard`` (a new file per process and attempt,
    named as TF's and torch's SummaryWriter name theirs). Written synchronously: a few records per
    ``train.log_every`` steps, flushed with metrics.jsonl."""

    def __init__(self, run_dir: str | Path):
        # tensorboard's own EventFileWriter opens files through tensorboard.compat.tf, which imports
        # TensorFlow when it is installed; its record framing (RecordWriter) does not.
        from tensorboard.compat.proto import event_pb2  # lazy: heavy (~100 ms)
        from tensorboard.summary.writer.record_writer import RecordWriter  # lazy: heavy (~100 ms)

        self.dir = Path(run_dir) / DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.0.dualtrain"
        )
        self._file = open(self.dir / name, "wb")
        self._records = RecordWriter(self._file)
        self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _add(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def write(self, step: int, tags: dict[str, str], fields: dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2  # lazy: heavy (~100 ms)

        values = [
            summary_pb2.Summary.Value(tag=tag, simple_value=float(fields[key]))
            for key, tag in tags.items()
            if _number(fields.get(key))
        ]
        if values:
            self._add(
                event_pb2.Event(
                    wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
                )
            )

    def train(self, fields: dict[str, Any]) -> None:
        self.write(fields["step"], TRAIN_TAGS, fields)

    def eval(self, fields: dict[str, Any]) -> None:
        self.write(fields["step"], EVAL_TAGS, fields)

    def flush(self) -> None:
        self._file.flush()

    def sizes(self, root: Path) -> dict[str, int]:
        """Every event file in the folder (this process's and earlier attempts') -> its size now,
        keyed by its path relative to ``root`` (the run directory)."""
        self.flush()
        return {
            str(p.relative_to(root)): p.stat().st_size
            for p in sorted(self.dir.iterdir())
            if p.is_file()
        }

    def close(self) -> None:
        self._file.close()


def _number(value: Any) -> bool:
    """A value TensorBoard can plot (inf and nan included), not None or a flag."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _no_tensorflow() -> None:
    """tensorboard's no-TensorFlow switch (its Bazel target //tensorboard/compat:no_tensorflow): its
    readers then use the bundled TF stub for file access instead of importing TensorFlow."""
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


def read_logdir(logdir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run: {tag: [(step, value), ...]}} for every run under ``logdir``, found and named the way
    ``tensorboard --logdir`` finds and names them (tensorboard's EventMultiplexer: a run is a folder
    holding event files, named by its path relative to ``logdir``)."""
    _no_tensorflow()
    from tensorboard.backend.event_processing.plugin_event_multiplexer import (  # lazy: framework
        EventMultiplexer,
    )
    from tensorboard.util import tensor_util  # lazy: framework (after _no_tensorflow())

    mux = EventMultiplexer(tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    # The scalars dashboard's view: plugin "scalars" data (simple_value scalars migrated on load).
    return {
        run: {
            tag: [
                (e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                for e in mux.Tensors(run, tag)
            ]
            for tag in tags
        }
        for run, tags in mux.PluginRunToTagToContent("scalars").items()
    }


def read_scalars(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the event files in one folder (a run's tensorboard
    folder)."""
    _no_tensorflow()
    from tensorboard.backend.event_processing.event_accumulator import (  # lazy: framework
        EventAccumulator,
    )

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
