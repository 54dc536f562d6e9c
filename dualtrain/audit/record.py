"""The record of an audited run: the files a recorder leaves, written once at the end, whole.

A recorded run directory holds what a dualtrain run directory holds (``metrics.jsonl``,
``shards.jsonl``, ``summary.json``, ``spec.yaml``, ``weights_init.npz``, ``weights_final.npz``,
TensorBoard scalars under ``tensorboard/``), so TensorBoard and the run-directory readers read it,
plus:

* ``audit.json``: what was recorded (framework, world size, steps), the script (path and text),
  and the configuration read from the script's objects (optimizer, scheduler, loss scaling,
  sampler or dataset, batchnorm layers); ``state`` is ``complete`` only once everything else is
  written (``recording`` before: compare refuses such a directory as half-written);
* ``replicas.jsonl``: per optimizer step and replica: ``step``, ``epoch``, ``replica``, ``count``,
  ``loss`` (the replica's mean over its rows), ``exact`` and ``pattern`` (each row's digest,
  dualtrain.audit.identity), ``indices`` (the dataset indices, when a sampler said them) and
  (torch) ``grad_norm``, the norm of the gradient this replica's optimizer stepped with.

A torch record's ``audit.json`` also says whether its replicas held the same weights
(``config.replicas``: the ranks whose parameters differ from rank 0's at the first step and at
the end, by a digest of each parameter's bytes).

Every file goes through a temporary name and a rename; ``audit.json`` is renamed into place last.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from dualtrain.audit.rows import ReplicaRow, StepRow, weighted_loss
from dualtrain.errors import UserError
from dualtrain.jsonio import json_safe, write_atomic
from dualtrain.records import tbevents
from dualtrain.records.envinfo import core_facts
from dualtrain.records.record import (
    METRICS_FILE,
    SHARDS_FILE,
    SPEC_FILE,
    SUMMARY_FILE,
    WEIGHTS_FINAL,
    WEIGHTS_INIT,
)

AUDIT_FILE = "audit.json"
REPLICAS_FILE = "replicas.jsonl"
FORMAT = "dualtrain-audit/1"
PARTS = "parts"
#: what a recorder may replace in a directory it recorded before
OWN = {
    AUDIT_FILE,
    REPLICAS_FILE,
    METRICS_FILE,
    SHARDS_FILE,
    SPEC_FILE,
    SUMMARY_FILE,
    WEIGHTS_INIT,
    WEIGHTS_FINAL,
    PARTS,
    tbevents.DIR,
}

_ACTIVE: list[str] = []
#: the folders this process prepared and has not finished: marked failed if it exits first
_OPEN: list[Path] = []


def claim(kind: str) -> None:
    """One recorder per process: a second one (before the first is closed) is a UserError."""
    if _ACTIVE:
        raise UserError(
            f"one audit recorder per process: a {_ACTIVE[0]} recorder is still open (close it, "
            f"or leave its `with` block, before starting another). Received: a second {kind} "
            f"recorder"
        )
    _ACTIVE.append(kind)


def release() -> None:
    _ACTIVE.clear()
    _OPEN.clear()


@atexit.register
def _abandon_open() -> None:
    """A process ending with a recording open (an exception out of a loop without ``with``, a
    notebook closed) leaves its folder saying it failed, not ``recording``."""
    for d in _OPEN:
        try:
            abandon(d)
        except OSError:
            pass
    _OPEN.clear()


def is_recorded(run_dir: str | Path) -> bool:
    """``run_dir`` was written by an audit recorder (finished or not)."""
    return (Path(run_dir) / AUDIT_FILE).is_file()


def check_folder(run_dir: str | Path) -> Path:
    """``run_dir`` may be recorded into: new, empty or an earlier record; anything else is a
    one-line UserError. Writes nothing."""
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise UserError(f"the audit run directory is a file. Received: {str(d)!r}")
    if d.is_dir() and any(d.iterdir()):
        if not is_recorded(d):
            raise UserError(
                f"{d} is not an audit record (no {AUDIT_FILE}) and not empty; the recorder "
                f"writes only into a new or empty folder or one it recorded before. Received: "
                f"{str(d)!r}"
            )
        foreign = sorted(p.name for p in d.iterdir() if p.name not in OWN)
        if foreign:
            raise UserError(
                f"{d} holds files no recorder wrote ({', '.join(foreign[:3])}); give a folder "
                f"of its own. Received: {str(d)!r}"
            )
    return d


def prepare(run_dir: str | Path, framework: str) -> Path:
    """The chief's first act: ``run_dir`` as :func:`check_folder` allows it, an earlier record's
    files cleared; writes audit.json with state ``recording`` (``failed`` if the process exits
    before :func:`finish` or :func:`abandon`)."""
    d = check_folder(run_dir)
    if d.is_dir():
        for p in d.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (d / PARTS).mkdir(parents=True, exist_ok=True)
    _write_json(d / AUDIT_FILE, {"format": FORMAT, "state": "recording", "framework": framework})
    if _ACTIVE:
        _OPEN.append(d)
    return d


def _write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(json_safe(obj), indent=2) + "\n")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(json_safe(r)) + "\n" for r in rows))


def write_part(
    run_dir: Path,
    rank: int,
    rows: list[dict[str, Any]],
    weights: dict[str, dict[str, str]] | None = None,
) -> None:
    """One process's replica rows (every process writes its own; the chief merges them), and
    ``weights``: its parameters' digests (:func:`digests`) at the first step and at the end."""
    if weights is not None:  # before the rows: the chief waits for the rows
        _write_json(run_dir / PARTS / f"rank-{rank}.weights.json", weights)
    _write_jsonl(run_dir / PARTS / f"rank-{rank}.jsonl", rows)


def digests(weights: dict[str, np.ndarray]) -> dict[str, str]:
    """Each array's digest (its dtype, shape and bytes): equal only where bit-identical."""
    out = {}
    for name, w in weights.items():
        h = hashlib.sha256(f"{w.dtype}{w.shape}".encode())
        h.update(np.ascontiguousarray(w).tobytes())
        out[name] = h.hexdigest()[:16]
    return out


def replica_weights(run_dir: Path, ranks: int) -> dict[str, Any] | None:
    """Which ranks' parameters differ from rank 0's, at the first step (``init``) and at the end
    (``final``), with the first differing names; None where the processes wrote no digests."""
    paths = [run_dir / PARTS / f"rank-{r}.weights.json" for r in range(ranks)]
    if ranks < 2 or not all(p.is_file() for p in paths):
        return None
    parts = [json.loads(p.read_text()) for p in paths]
    out: dict[str, Any] = {"ranks": ranks}
    for when in ("init", "final"):
        ref = parts[0][when]
        differ = {
            str(r): [n for n in sorted(set(ref) | set(p[when])) if ref.get(n) != p[when].get(n)]
            for r, p in enumerate(parts)
        }
        out[when] = {
            r: names[:5] + (["..."] if len(names) > 5 else [])
            for r, names in differ.items()
            if names
        }
        out[f"{when}_arrays"] = {r: len(names) for r, names in differ.items() if names}
    out["arrays"] = len(parts[0]["final"])
    return out


def read_parts(run_dir: Path, ranks: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every process's part (waiting for the other processes' to appear), merged by step and
    replica."""
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    for r in range(ranks):
        path = run_dir / PARTS / f"rank-{r}.jsonl"
        while not path.is_file():
            if (run_dir / PARTS / f"rank-{r}.failed").is_file():
                raise RuntimeError(f"process {r}'s recorder stopped (its stderr says where)")
            if time.monotonic() > deadline:
                raise UserError(
                    f"process {r} wrote no record into {run_dir / PARTS} in {timeout_s:.0f}s: "
                    f"every process must close its recorder. Received: {ranks} processes"
                )
            time.sleep(0.05)
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: (r["step"], r["replica"]))


def script_info() -> dict[str, Any]:
    """The script that records (``sys.argv[0]``): its path, arguments and text (the diagnoses
    quote its lines), as audit.json's ``script`` (read back as dualtrain.audit.read.Script)."""
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    text = None
    if path is not None and path.suffix == ".py" and path.is_file():
        text = path.read_text(errors="replace")
    return {"path": str(path) if path else None, "argv": sys.argv[1:], "text": text}


def _save_npz(path: Path, weights: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    arrays: dict[str, Any] = dict(weights)  # savez's stubs type its keywords as its options'
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _metrics_rows(steps: list[dict[str, Any]], replicas: list[ReplicaRow]) -> list[StepRow]:
    """The recorder's step rows with each step's loss and sample count from its replicas'."""
    by_step: dict[int, list[ReplicaRow]] = {}
    for r in replicas:
        by_step.setdefault(r.step, []).append(r)
    out = []
    for s in steps:
        loss, n = weighted_loss(by_step.get(int(s["step"]), []))
        out.append(StepRow.of({**s, "loss": loss, "samples": n}))
    return out


def _shard_rows(replicas: list[ReplicaRow]) -> list[dict[str, Any]]:
    return [
        {
            "step": r.step,
            "epoch": r.epoch,
            "replica": r.replica,
            "digest": hashlib.sha256(",".join(r.exact).encode()).hexdigest()[:16],
            "count": r.count,
        }
        for r in replicas
    ]


def finish(
    run_dir: Path,
    *,
    framework: str,
    world_size: int,
    steps: list[dict[str, Any]],
    ranks: int,
    config: dict[str, Any],
    weights_init: dict[str, np.ndarray],
    weights_final: dict[str, np.ndarray],
    env: dict[str, Any],
    wall_s: float,
) -> None:
    """The chief's last act: merge the processes' parts, write every file, audit.json last."""
    replicas = [ReplicaRow.of(r) for r in read_parts(run_dir, ranks)]
    in_step = replica_weights(run_dir, ranks)
    if in_step is not None:
        config = {**config, "replicas": in_step}
    metrics = _metrics_rows(steps, replicas)
    _write_jsonl(run_dir / REPLICAS_FILE, [r.to_json() for r in replicas])
    _write_jsonl(run_dir / METRICS_FILE, [m.to_json() for m in metrics])
    _write_jsonl(run_dir / SHARDS_FILE, _shard_rows(replicas))
    _save_npz(run_dir / WEIGHTS_INIT, weights_init)
    _save_npz(run_dir / WEIGHTS_FINAL, weights_final)
    name = f"audit-{framework}"
    write_atomic(
        run_dir / SPEC_FILE,
        yaml.safe_dump({"name": name, "backend": framework, "audit": True}, sort_keys=False),
    )
    facts = core_facts()
    summary = {
        "backend": framework,
        "world_size": world_size,
        "steps": len(steps),
        "wall_s": wall_s,
        "audit": True,
        "versions": {**facts["versions"], **env.get("versions", {})},
        "env": {**facts, **env},
    }
    _write_json(run_dir / SUMMARY_FILE, summary)
    if tbevents.available():
        events = tbevents.EventLog(run_dir)
        for row in metrics:
            events.train(row.to_json())
        events.close()
    shutil.rmtree(run_dir / PARTS, ignore_errors=True)
    _write_json(
        run_dir / AUDIT_FILE,
        {
            "format": FORMAT,
            "state": "complete",
            "framework": framework,
            "world_size": world_size,
            "steps": len(steps),
            "script": script_info(),
            "config": config,
        },
    )


def part_failed(run_dir: Path, rank: int) -> None:
    """A process whose recorder stopped: its part says so, so the chief's :func:`read_parts`
    stops waiting for it (the record is then marked failed, not written without its rows)."""
    if (run_dir / PARTS).is_dir():
        write_atomic(run_dir / PARTS / f"rank-{rank}.failed", "")


class Failing(Protocol):
    """A recorder that goes inert on a failure of its own (both backends' recorders)."""

    failed: bool

    def fail(self, where: str, error: BaseException) -> None: ...


def guarded(recorder: Failing, where: str, body: Callable[..., None], *args: Any) -> None:
    """``body(*args)``, the recorder's work at ``where`` inside the user's training: nothing once
    the recorder failed; a failure of its own handed to ``recorder.fail`` (said, the recording
    dropped, the training goes on); a misuse the recorder names (a UserError) raised."""
    if recorder.failed:
        return
    try:
        body(*args)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (said by recorder.fail, and the training goes on)
        recorder.fail(where, e)


def say_stopped(where: str, error: BaseException) -> None:
    """A recorder that failed inside the training it records: said once on stderr (it records
    nothing more; the training goes on)."""
    print(
        f"dualtrain audit: the recorder stopped at {where} and records nothing more "
        f"(training goes on): {type(error).__name__}: {error}",
        file=sys.stderr,
    )


def abandon(run_dir: Path) -> None:
    """A recording that ended in an exception: the directory says so (compare refuses it)."""
    _write_json(run_dir / AUDIT_FILE, {"format": FORMAT, "state": "failed"})
    if run_dir in _OPEN:
        _OPEN.remove(run_dir)
