"""A run's records brought back to a checkpoint: a restarted or resumed run shows every step once
(metrics, shards, TensorBoard events written after the checkpoint are cut), and a run continued
into a new folder starts from the checkpoint's records."""

from __future__ import annotations

from pathlib import Path

from dualtrain.errors import UserError
from dualtrain.records import tbevents
from dualtrain.records.record import SUMMARY_FILE, WEIGHTS_FINAL
from dualtrain.runtime import checkpoint


def has_trained(run_dir: Path) -> bool:
    """Whether a run has recorded a training step (or a checkpoint) yet."""
    metrics = run_dir / "metrics.jsonl"
    return (metrics.is_file() and metrics.stat().st_size > 0) or (run_dir / checkpoint.DIR).is_dir()


def truncate_records(run_dir: Path, ckpt: checkpoint.Checkpoint) -> None:
    """Cut metrics.jsonl and shards.jsonl back to where they stood at the checkpoint, and drop what
    a finished attempt leaves (summary, final weights, later gradient dumps), so the continued run
    appends exactly the steps after it: no step twice, none missing."""
    for name, size in ckpt.state["records"].items():
        path = run_dir / name
        if not path.is_file() or path.stat().st_size < size:
            raise UserError(
                f"{path} is shorter than at the checkpoint of step {ckpt.step} "
                f"({size} bytes); the run directory was changed. Received: {str(path)!r}"
            )
        with open(path, "r+b") as f:
            f.truncate(size)
    events = run_dir / tbevents.DIR
    for path in events.iterdir() if events.is_dir() else ():
        if str(path.relative_to(run_dir)) not in ckpt.state["records"]:
            path.unlink()  # an event file begun after the checkpoint
    for name in (SUMMARY_FILE, WEIGHTS_FINAL):
        (run_dir / name).unlink(missing_ok=True)
    for dump in run_dir.glob("grads_step*.npz"):
        if int(dump.stem.removeprefix("grads_step")) > ckpt.step:
            dump.unlink()


def check_records(ckpt: checkpoint.Checkpoint) -> Path:
    """The run directory of a --resume-from checkpoint, once it is known to hold the records up to
    the checkpoint, which the continued run starts from (reads only)."""
    source = ckpt.path.parent.parent
    for name, size in ckpt.state["records"].items():
        src = source / name
        if not src.is_file() or src.stat().st_size < size:
            raise UserError(
                f"the checkpoint's run directory {source} lacks its records ({name} up to "
                f"{size} bytes), which the continued run starts from. Received: "
                f"{str(ckpt.path)!r}"
            )
    return source


def copy_records(ckpt: checkpoint.Checkpoint, run_dir: Path) -> None:
    """A run that continues another run's checkpoint starts with that run's records up to it."""
    source = check_records(ckpt)
    for name, size in ckpt.state["records"].items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        with open(source / name, "rb") as f:
            (run_dir / name).write_bytes(f.read(size))
