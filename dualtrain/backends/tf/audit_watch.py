"""What the Keras recorder watches while the script runs: the fit calls of its model, the one
whose callbacks list the recorder recorded, any other (a warm-up) run with the model as the
script built it; the wrappers of the model's train step and of its optimizer's all-reduce, traced
into fit's train function, that hand each replica's rows, loss and the summed gradient's norm to
the recorder; and the arguments the recorded fit was given (its input, shuffle, callbacks, class
and sample weights), read from fit's frame.

A wrapper's own failure is handed to the recorder (which says it and goes inert), and the step
trains as the script built it: the recorder never fails fit's train function."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dualtrain.backends.tf.audit_digests import Digests, input_of
from dualtrain.errors import UserError


def among_callbacks(recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``recorder`` is among a fit call's callbacks (``callbacks=``, or fit's sixth
    positional argument; a list or a CallbackList)."""
    given = kwargs["callbacks"] if "callbacks" in kwargs else (args[5] if len(args) > 5 else None)
    return any(c is recorder for c in getattr(given, "callbacks", given) or ())


def bare_fit(
    model: Any, fit: Any, step: Any, jit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A fit the recorder is not given (a warm-up before the recorded one): run with the model's
    own train step and jit_compile, its train function built for it and again after it (the
    recorded fit then traces the recorder's wrappers, the optimizer's included)."""
    print(
        "dualtrain audit: a fit without the recorder among its callbacks is not recorded "
        "(pass it in callbacks=[...] of the fit to record)",
        file=sys.stderr,
    )
    wrapped, recorded_jit = model.train_step, model.jit_compile
    model.train_step, model.jit_compile, model.train_function = step, jit, None
    try:
        return fit(*args, **kwargs)
    finally:
        model.train_step, model.jit_compile, model.train_function = wrapped, recorded_jit, None


def fit_arguments(model: Any) -> dict[str, Any]:
    """The arguments the running ``fit`` of ``model`` was given (read from fit's frame: a
    callback is not handed them, and a recorder made in fit's own arguments is made after
    ``model.fit`` was looked up, so no wrapper of fit sees that call); {} where no such frame is
    found."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


def fit_weights(found: dict[str, Any]) -> dict[str, Any]:
    """What fit's arguments (``found``: fit_arguments') add to the loss: ``class_weight`` (class
    -> weight) and whether a ``sample_weight`` was given."""
    weights = found.get("class_weight")
    return {
        "class_weight": {int(k): float(v) for k, v in weights.items()} if weights else None,
        "sample_weight": found.get("sample_weight") is not None,
    }


class Patches:
    """Attributes set on the script's objects for one recording, each put back by :meth:`undo`
    (a later fit, or another recorder, starts from the objects as the script built them)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        if name in vars(obj):
            old = vars(obj)[name]
            self._undo.append(lambda: setattr(obj, name, old))
        else:
            self._undo.append(lambda: delattr(obj, name))
        setattr(obj, name, value)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


#: what the lr callbacks' settings are named in Keras
PLATEAU = ("monitor", "factor", "patience", "min_delta", "cooldown", "min_lr", "mode")


def lr_callbacks(callbacks: Any) -> list[dict[str, Any]]:
    """The callbacks of fit that set the lr: ReduceLROnPlateau (its settings) and
    LearningRateScheduler."""
    listed = getattr(callbacks, "callbacks", callbacks) or []
    out: list[dict[str, Any]] = []
    for cb in listed if isinstance(listed, (list, tuple)) else []:
        if isinstance(cb, keras.callbacks.ReduceLROnPlateau):
            out.append({"type": "ReduceLROnPlateau"} | {k: getattr(cb, k, None) for k in PLATEAU})
        elif isinstance(cb, keras.callbacks.LearningRateScheduler):
            out.append({"type": "LearningRateScheduler"})
    return [{k: _number(v) for k, v in c.items()} for c in out]


def early_stopping(callbacks: Any) -> Any:
    """fit's EarlyStopping callback, if it has one (read again as fit ends: where it stopped,
    and whether it restores the best weights after the recorder's ``on_train_end``)."""
    listed = getattr(callbacks, "callbacks", callbacks) or []
    found = [c for c in listed if isinstance(c, keras.callbacks.EarlyStopping)]
    return found[0] if isinstance(listed, (list, tuple)) and found else None


def stopping_facts(cb: Any) -> dict[str, Any]:
    keys = ("monitor", "patience", "min_delta", "restore_best_weights", "stopped_epoch")
    return {k: _number(getattr(cb, k, None)) for k in keys}


def _number(v: Any) -> Any:
    return float(v) if isinstance(v, np.floating) else int(v) if isinstance(v, np.integer) else v


def _sums(tracker: Any) -> tuple[Any, Any]:
    """A loss tracker's (total, count) as this replica holds them; NaNs without a tracker."""
    if tracker is None:
        return tf.constant(float("nan")), tf.constant(float("nan"))
    return tf.convert_to_tensor(tracker.total), tf.convert_to_tensor(tracker.count)


class Wrapping:
    """The recorder's wrappers of one model (its train step and fit, from the recorder's making)
    and of the optimizer fit uses (from fit's start), undone by :meth:`undo`. ``recorder``: the
    KerasRecorder they report to (``host_rows``, ``host_norm``, ``fail``, ``failed``, ``close``)."""

    def __init__(self, model: Any, recorder: Any):
        self.model, self.recorder, self.patches = model, recorder, Patches()
        self.sample_weighted = False
        original_step = model.train_step
        digests = Digests()

        def recorded_step(data: Any) -> Any:
            if isinstance(data, (tuple, list)) and len(data) == 3 and data[2] is not None:
                self.sample_weighted = True  # (x, y, sample_weight) from the dataset itself
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = digests.traced(input_of(data))  # sums, or rows to digest on the host
            tracker = next((m for m in model.metrics if m.name == "loss"), None)
            before = _sums(tracker)  # this replica's copy (read in its replica context)
            logs = original_step(data)
            after = _sums(tracker)  # after the step's update (ordered on the variables)
            loss = (after[0] - before[0]) / (after[1] - before[1])  # NaN: no tracker
            tf.py_function(recorder.host_rows, [rid, loss, *rows], [])
            return logs

        def train_step(data: Any) -> Any:
            if recorder.failed:
                return original_step(data)
            try:  # traced: a failure here would fail fit's train function
                return recorded_step(data)
            except Exception as e:  # noqa: BLE001  (said, and fit trains the step unrecorded)
                recorder.fail("the train step", e)
                return original_step(data)

        original_fit = model.fit
        # the wrapper hands values to Python (tf.py_function), which XLA cannot compile: fit's
        # train function runs without jit_compile while recorded (docs/audit.md); again as fit
        # starts where the script compiled the model after making the recorder (compile sets it)
        compiled = getattr(model, "_compile_config", None)
        self.jit, model.jit_compile = model.jit_compile, False

        def fit(*args: Any, **kwargs: Any) -> Any:
            if not among_callbacks(recorder, args, kwargs):  # another fit (a warm-up)
                return bare_fit(model, original_fit, original_step, self.jit, args, kwargs)
            if getattr(model, "_compile_config", None) is not compiled:  # compiled again since
                self.jit, model.jit_compile = model.jit_compile, False
            try:
                return original_fit(*args, **kwargs)
            except BaseException:  # fit calls no callback when it fails: the record says so
                recorder.close()
                raise

        self.patches.set(model, "train_step", train_step)
        self.patches.set(model, "fit", fit)
        model.train_function = None  # rebuilt by fit with the wrapper
        self.adding: dict[int, str] = {}  # id -> "name (Class)" of each layer calling add_loss
        self.patches.set(
            keras.layers.Layer, "add_loss", self._add_loss(keras.layers.Layer.add_loss)
        )

    def _add_loss(self, original: Any) -> Any:
        """Layer.add_loss, noting each layer that adds a loss term of its own in its ``call`` (a
        term Keras adds to the loss it reports and differentiates); an activity regularizer's,
        which Layer.__call__ adds, is read as a regularizer (audit_setup.loss_terms)."""

        def add_loss(layer: Any, loss: Any) -> Any:
            caller = sys._getframe(1).f_code
            if not (caller.co_name == "__call__" and caller.co_filename.endswith("layer.py")):
                self.adding[id(layer)] = f"{layer.name} ({type(layer).__name__})"
            return original(layer, loss)

        return add_loss

    def added_losses(self) -> list[str]:
        """The recorded model's layers (itself included) that called add_loss, in layer order."""
        layers = [self.model, *self.model._flatten_layers(include_self=False)]
        return [self.adding[id(x)] for x in layers if id(x) in self.adding]

    def optimizer(self, model: Any) -> None:
        """The norm of the gradients Keras's own all-reduce summed over the replicas (its
        ``_all_reduce_sum_gradients``, in the replica's update step): no all-reduce of its own. A
        LossScaleOptimizer's inner optimizer is wrapped: it sees the unscaled gradients, and a
        step the scaler skips reaches no update (its norm is NaN, as torch's recorder leaves it).
        Wrapped as fit starts (on_train_begin, before fit traces its train function): the optimizer
        fit uses, also where the script compiled the model again after making the recorder."""
        opt = getattr(model, "optimizer", None)
        if opt is None:
            raise UserError("keras_recorder needs a compiled model (call model.compile first)")
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            opt = opt.inner_optimizer
        original, recorder = opt._all_reduce_sum_gradients, self.recorder

        def all_reduce_sum_gradients(grads_and_vars: Any) -> Any:
            reduced = original(grads_and_vars)
            if recorder.failed:
                return reduced
            try:  # traced: a failure here would fail fit's train function
                grads = [tf.cast(g, tf.float32) for g, _ in reduced if g is not None]
                ctx = tf.distribute.get_replica_context()
                rid = ctx.replica_id_in_sync_group if ctx else 0
                lr = tf.cast(opt.learning_rate, tf.float32)  # the lr this update uses
                tf.py_function(recorder.host_norm, [rid, tf.linalg.global_norm(grads), lr], [])
            except Exception as e:  # noqa: BLE001  (said, and the update runs unrecorded)
                recorder.fail("the gradient all-reduce", e)
            return reduced

        self.patches.set(opt, "_all_reduce_sum_gradients", all_reduce_sum_gradients)

    def undo(self) -> None:
        """The model, its optimizer and fit as they were before the recorder (a later fit, or
        another recorder, starts from the model as the script built it)."""
        self.patches.undo()
        self.model.jit_compile = self.jit
        self.model.train_function = None
