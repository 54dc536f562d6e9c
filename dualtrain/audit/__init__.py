"""Audit the training scripts a team already has: record a hand-written PyTorch (DDP) loop and a
Keras ``fit`` (MirroredStrategy), then ``dualtrain compare RUN_A RUN_B`` (or
``dualtrain.compare(run_a, run_b)``) on the two records says
whether they train the same way and names the classic differences (docs/audit.md).

Framework-free: the recorders live in dualtrain.backends.torch.audit and
dualtrain.backends.tf.audit and are imported only when asked for, so importing this package
imports neither framework.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.audit.compare import AuditComparison, compare_recorded
from dualtrain.audit.identity import row_digests
from dualtrain.audit.read import read_recorded
from dualtrain.audit.record import is_recorded
from dualtrain.errors import UserError

__all__ = [
    "AuditComparison",
    "compare_recorded",
    "is_recorded",
    "keras_recorder",
    "lightning_recorder",
    "rows_fed",
    "torch_recorder",
    "transformers_recorder",
]

#: the recorders' modules, by framework (loaded by name: they sit in the backends, above this
#: package in the pipeline, and import the record format from here)
RECORDERS = {
    "torch": "dualtrain.backends.torch.audit",
    "tf": "dualtrain.backends.tf.audit",
    "trainers": "dualtrain.backends.torch.audit_trainers",
}


def rows_fed(run_dir: str | Path, rows: Any) -> Any:
    """The rows a recorded run fed, as indices into ``rows`` (the dataset's inputs, first axis the
    samples, as the run fed them): step by step, each step's replica 0 rows, then replica 1's, ...
    (the blocks MirroredStrategy hands out). For a port that must feed what the recorded run fed
    (examples/audit/hub): each row found by its exact digest. A row of the record that ``rows``
    does not hold is a one-line UserError."""
    run = read_recorded(run_dir)
    where: dict[str, int] = {}
    for i, d in enumerate(row_digests(np.asarray(rows))[0]):
        where.setdefault(d, i)
    out = []
    for s in run.steps:
        for row in run.rows(s.step):
            for d in row.exact:
                if d not in where:
                    raise UserError(
                        f"{run_dir} fed a row these rows do not hold (step {s.step}, replica "
                        f"{row.replica}); give the inputs as the run fed them. Received: "
                        f"{len(where)} distinct rows"
                    )
                out.append(where[d])
    return np.asarray(out, dtype=np.int64)


def torch_recorder(
    run_dir: str | Path,
    *,
    model: Any,
    optimizer: Any,
    scaler: Any = None,
    loader: Any = None,
    sampler: Any = None,
    scheduler: Any = None,
) -> Any:
    """A recorder for a PyTorch loop (a context manager; ``rec.batch(inputs)`` at each optimizer
    step's start, ``rec.step(loss)`` after it, ``rec.close()`` or the ``with`` block's end to
    write ``run_dir``). ``loader``/``sampler``: where the sample indices come from (a
    DistributedSampler's); ``scaler``: a GradScaler; ``scheduler``: recorded for the report.
    Every DDP process makes one, after ``init_process_group``."""
    module = importlib.import_module(RECORDERS["torch"])
    return module.TorchRecorder(
        run_dir,
        model=model,
        optimizer=optimizer,
        scaler=scaler,
        loader=loader,
        sampler=sampler,
        scheduler=scheduler,
    )


def lightning_recorder(run_dir: str | Path) -> Any:
    """A PyTorch Lightning callback recording ``trainer.fit`` into ``run_dir`` (pass it in
    ``Trainer(callbacks=[...])``): what torch_recorder records of a hand-written loop, read from
    the trainer's model, optimizer, scheduler, GradScaler and train loader as training starts. A
    recorder failure is said on stderr and training goes on unrecorded (the folder marked
    failed). For ``lightning.pytorch`` and the older ``pytorch_lightning`` alike."""
    module = importlib.import_module(RECORDERS["trainers"])
    return module.lightning_callback(run_dir)


def transformers_recorder(run_dir: str | Path) -> Any:
    """A Hugging Face ``TrainerCallback`` recording ``trainer.train()`` into ``run_dir`` (pass it
    in ``Trainer(callbacks=[...])``): each optimizer step's rows (read from the model's training
    forwards), its loss (the model's ``outputs.loss``, averaged over accumulated micro-batches),
    lr, gradient norm, settings and initial weights, as torch_recorder records a loop. A recorder
    failure is said on stderr and training goes on unrecorded (the folder marked failed)."""
    module = importlib.import_module(RECORDERS["trainers"])
    return module.transformers_callback(run_dir)


def keras_recorder(run_dir: str | Path, *, model: Any, weight_map: str | Path | None = None) -> Any:
    """A Keras callback recording ``model.fit`` (pass it in ``callbacks=[...]``; the record is
    written when fit ends). ``model``: the compiled model, built under a MirroredStrategy or
    MultiWorkerMirroredStrategy scope; the recorder wraps its train step and its optimizer's
    ``apply_gradients`` to see each replica's rows, the gradient norm and the loss scale.
    ``weight_map``: a model pair's map file (``model.weight_map``'s format, docs/own-models.md):
    the weights are recorded under the torch script's parameter names and layout, so compare
    pairs them by name (otherwise in order, with Keras's layouts converted by kind)."""
    module = importlib.import_module(RECORDERS["tf"])
    return module.KerasRecorder(
        run_dir, model=model, weight_map=None if weight_map is None else str(weight_map)
    )
