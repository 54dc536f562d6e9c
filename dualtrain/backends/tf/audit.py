"""The audit recorder for Keras ``fit`` under a tf.distribute strategy (MirroredStrategy,
MultiWorkerMirroredStrategy): a callback, plus a thin wrapper of the model's train step and of its
optimizer's gradient all-reduce for what a callback cannot see::

    rec = dualtrain.audit.keras_recorder("runs/audit_keras", model=model)
    model.fit(train_ds, epochs=..., callbacks=[rec])      # the record is written as fit ends

Per step: the lr and loss scale at the step's start and whether the optimizer applied the step
(its ``iterations`` moved: a LossScaleOptimizer that skips leaves it) from the callback; from the
wrappers, each replica's rows (their digests, dualtrain.audit.identity) and its loss, both in the
replica's train step, and the norm of the gradient Keras's all-reduce summed (no all-reduce of the
recorder's own). A replica's loss is the change of its own copy of fit's loss tracker over its step
(the tracker's variables are per replica until read across them): ``sum`` grows by the replica's
loss times its rows, ``count`` by its rows, so the step's loss, the rows' weighted mean, is the
global batch's as fit computes it.

A failure of the recorder inside fit (a hook, a wrapper as traced, a host call) never stops fit: it
is said once on stderr, the folder is marked failed, and fit trains on unrecorded. A misuse it
names (a UserError: steps_per_execution, a closed recorder) is raised.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from dualtrain.audit import record
from dualtrain.backends.tf.audit_digests import Digests
from dualtrain.backends.tf.audit_setup import (
    canonical_weights,
    check_setup,
    final_weights,
    fit_config,
    meet,
    rank_of,
)
from dualtrain.backends.tf.audit_watch import Wrapping
from dualtrain.backends.tf.envinfo import backend_facts
from dualtrain.errors import UserError


class KerasRecorder(keras.callbacks.Callback):
    """See the module docstring; made by dualtrain.audit.keras_recorder."""

    def __init__(self, run_dir: str | Path, *, model: Any, weight_map: str | None = None):
        super().__init__()
        strategy = check_setup(model)
        self.weight_map = None if weight_map is None else str(weight_map)
        if self.weight_map is not None and model.built:
            canonical_weights(model, self.weight_map)  # a map that does not fit: before anything
        record.claim("keras")
        try:
            resolver = getattr(strategy, "cluster_resolver", None)
            self.rank = rank_of(resolver) if resolver is not None else 0
            self.ranks = (
                max(1, int(strategy.extended._num_workers))
                if hasattr(strategy.extended, "_num_workers")
                else 1
            )
            self.dir = Path(run_dir)
            if self.rank == 0:  # refused now; written when fit starts (nothing before)
                record.check_folder(self.dir)
            self.prepared = False
            self.started: float | None = None
        except BaseException:
            record.release()
            raise
        self.replicas = strategy.num_replicas_in_sync
        self.lock = threading.Lock()
        self.steps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.norms: dict[int, tuple[float, float]] = {}
        self.epoch = 1
        self.fresh = False
        self.last: int | None = None
        self.closed = False
        self.failed = False
        self.wrapping = Wrapping(model, self)

    # ---- a failure inside fit: said, the recording dropped, the training goes on -----------------
    def fail(self, where: str, error: BaseException) -> None:
        """The recorder failed at ``where`` inside fit: said once on stderr, the folder marked
        failed (compare refuses it), the recorder's wrappers inert from here on; fit trains on.
        A misuse the recorder names (a UserError) is raised instead, before any step trains."""
        if not self.failed:
            record.say_stopped(where, error)
        self.failed = True
        if self.rank == 0 and self.prepared:
            record.abandon(self.dir)
            self.prepared = False
        record.release()

    def close(self) -> None:
        """End a recording that did not end with its fit (a recorder closes itself when fit
        returns): one whose fit failed or never ran. Its folder says it failed (compare refuses
        it) and the process may start another recorder. Closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.rank == 0 and self.prepared:
                record.abandon(self.dir)
        finally:
            record.release()
            self.wrapping.undo()

    def host_rows(self, *args: Any) -> None:
        record.guarded(self, "a replica's rows", self._rows, *args)

    def _rows(self, rid: Any, loss: Any, *rows: Any) -> None:
        """A replica's step: its digests from the graph, or its rows to digest here."""
        exact, pattern = Digests.host(*rows)
        row = {
            "step": len(self.steps),
            "epoch": self.epoch,
            "replica": int(rid),
            "count": len(exact),
            "exact": exact,
            "pattern": pattern,
            "indices": None,
            "loss": None if np.isnan(float(loss)) else float(loss),
        }
        with self.lock:
            self.rows.append(row)

    def host_norm(self, *args: Any) -> None:
        record.guarded(self, "the gradient norm", self._norm, *args)

    def _norm(self, rid: Any, norm: Any, lr: Any) -> None:
        if int(rid) == 0:
            self.norms[len(self.steps)] = (float(norm), float(lr))

    # ---- the callback ----------------------------------------------------------------------------
    def _iterations(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_begin(self, logs: Any = None) -> None:
        if self.closed:  # (a second fit given the recorder its first fit wrote)
            raise UserError("this audit recorder is closed; make a new one for another fit")
        if self.started is not None:
            return  # the recorder listed twice in callbacks: its first listing records
        spe = getattr(self.model, "steps_per_execution", 1)
        if int(keras.ops.convert_to_numpy(spe)) != 1:
            self.close()
            raise UserError(
                "keras_recorder records each step: compile with steps_per_execution=1. "
                f"Received: steps_per_execution={int(keras.ops.convert_to_numpy(spe))}"
            )
        self.started = time.perf_counter()
        try:
            self.wrapping.optimizer(self.model)
            if self.weight_map is not None and self.rank == 0:  # fits the model fit built
                canonical_weights(self.model, self.weight_map)  # (or refused before writing)
            self.init: dict[str, Any] = {}
            self.fresh = True  # read at the first batch, after every callback's on_train_begin
            self.config, self.stopper = fit_config(self.model, self.ranks)
            meet(self.rank, self.ranks)  # before the folder: a lone recorder writes nothing
            if self.rank == 0:  # the folder is written from here on: a fit never begun leaves none
                record.prepare(self.dir, "tf")
                self.prepared = True
        except UserError:  # a map that does not fit the model fit built: nothing half-written
            self.close()
            raise
        except Exception as e:  # noqa: BLE001  (said, and fit trains unrecorded)
            self.fail("on_train_begin", e)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch + 1

    def _drop_unfinished(self) -> None:
        """A batch begun that never ended: a dataset of unknown length (from_generator) ran out
        at it, and fit caught that and called no end. No step ran (no rows, no update)."""
        if self.steps and "skipped" not in self.steps[-1]:
            self.steps.pop()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        record.guarded(self, "on_train_batch_begin", self._batch_begin)

    def _batch_begin(self) -> None:
        if self.fresh and self.rank == 0:  # the weights the first step starts from: after a
            self.init = canonical_weights(self.model, self.weight_map)  # BackupAndRestore's
        self.fresh = False
        self._drop_unfinished()
        opt = self.model.optimizer
        scale = None
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            scale = float(keras.ops.convert_to_numpy(opt.dynamic_scale))
        lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
        self.before = self._iterations() if self.last is None else self.last  # the last step's end
        self.steps.append(
            {"step": len(self.steps) + 1, "epoch": self.epoch, "lr": lr, "loss_scale": scale}
        )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        record.guarded(self, "on_train_batch_end", self._batch_end)

    def _batch_end(self) -> None:
        self.last, step = self._iterations(), self.steps[-1]
        step["skipped"] = self.last == self.before
        norm, lr = self.norms.get(step["step"], (float("nan"), None))
        step["grad_norm"] = norm
        if lr is not None:  # the lr the update used (a callback after this one may set it)
            step["lr"] = lr

    def on_train_end(self, logs: Any = None) -> None:
        if self.closed:
            return  # listed twice in callbacks: written at the first call
        self.closed = True
        try:
            if self.failed:
                return
            self._drop_unfinished()
            fed_by_fit(self.steps, self.rows)
            terms = self.config["loss_terms"]  # what fit's train function saw as traced:
            terms["add_loss"] = self.wrapping.added_losses()  # layers' own loss terms, and
            weighted = self.wrapping.sample_weighted and not terms.get("class_weight")  # (fit
            terms["sample_weight"] = terms["sample_weight"] or weighted  # makes class_weight one)
            rows = sorted(self.rows, key=lambda r: (r["step"], r["replica"]))
            record.write_part(self.dir, self.rank, rows)
            if self.rank == 0:
                final = final_weights(self.model, self.weight_map, self.stopper, self.config)
                record.finish(
                    self.dir,
                    framework="tf",
                    world_size=self.replicas,
                    steps=self.steps,
                    ranks=self.ranks,
                    config=self.config,
                    weights_init=final if self.fresh else self.init,  # fresh: no step ran
                    weights_final=final,
                    env={"tf": backend_facts()},
                    wall_s=time.perf_counter() - (self.started or 0.0),
                )
        except UserError:
            if self.rank == 0 and self.prepared:
                record.abandon(self.dir)  # nothing half-written: the folder says it failed
            raise
        except Exception as e:  # noqa: BLE001  (said; the fit's end goes on)
            self.fail("on_train_end", e)
        finally:
            record.release()
            self.wrapping.undo()


def fed_by_fit(steps: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Steps with no row: the callbacks were called by a loop of the script's own (a custom
    ``strategy.run`` loop), not by fit, whose train function the recorder wraps to see each
    replica's rows; the record would hold steps without samples or losses."""
    if steps and not rows:
        raise UserError(
            f"keras_recorder records model.fit: its {len(steps)} step(s) fed fit's train function "
            f"no row (the callbacks were called by a loop of the script's own, such as "
            f"strategy.run). Record a fit, or the loop's steps with a spec (docs/audit.md). "
            f"Received: {len(steps)} steps, 0 rows"
        )
