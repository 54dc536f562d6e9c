"""torch.optim's and GradScaler's state as TF variables: created once per parameter (mirrored under
the strategy), and read and written in canonical names and layouts for checkpoints. The update
arithmetic itself is dualtrain.core.update_rules (the engine runs it on these variables)."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from dualtrain.core import update_rules
from dualtrain.errors import UserError
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.spec import SLOT_ORDER, LossScaleSpec, OptimizerSpec

from .mapping import canonical, engine_names
from .model import Conversion


class OptimizerVariables:
    """The slots ``opt`` needs (zeros; empty lists for the others), the applied-update count
    (momentum-buffer creation, Adam's bias correction) and fp16's loss scale and good-step count.
    Create it inside the strategy's scope."""

    def __init__(
        self,
        opt: OptimizerSpec,
        params: Sequence[tf.Variable],
        *,
        fp16: bool,
        loss_scale: LossScaleSpec,
        conversion: Conversion,
    ):
        self.fp16 = fp16
        self.conversion = conversion
        need = update_rules.slot_names(opt)
        self.slots: dict[str, list[tf.Variable]] = {
            key: [tf.Variable(tf.zeros(p.shape, p.dtype), trainable=False) for p in params]
            if key in need
            else []
            for key in SLOT_ORDER
        }
        """Per slot (torch.optim's names), one variable per parameter; an empty list for a slot
        this optimizer does not keep."""
        self.applied = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.scale = tf.Variable(
            loss_scale.init if fp16 else 1.0, dtype=tf.float32, trainable=False
        )
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False)

    def state(self, param_names: Sequence[str]) -> OptimizerState:
        """The slots in canonical names and layouts, as torch.optim holds them: none before the
        first applied update (torch creates its state then)."""
        applied = int(self.applied.numpy())
        slots = {}
        if applied:
            for slot, variables in self.slots.items():
                # a slot this optimizer does not use is an empty list; a model pair's parts of
                # one array (its packed attention projection) are joined into the canonical one
                items = [(n, v.numpy()) for n, v in zip(param_names, variables, strict=False)]
                for name, value in canonical(self.conversion, items).items():
                    slots[f"{slot}/{name}"] = value
        return OptimizerState(
            slots=slots,
            applied=applied,
            loss_scale=float(self.scale.numpy()) if self.fp16 else 1.0,
            good_steps=int(self.good_steps.numpy()) if self.fp16 else 0,
        )

    def load(self, state: OptimizerState, param_names: Sequence[str]) -> None:
        for variables in self.slots.values():  # slots the state does not name start from zero
            for var in variables:
                var.assign(tf.zeros(var.shape, var.dtype))
        names = list(param_names)
        for key, whole in state.slots.items():
            slot, _, canonical_name = key.partition("/")
            held = self.slots.get(slot)
            parts = engine_names(self.conversion, {canonical_name: whole})
            if not held or any(name not in names for name in parts):
                raise UserError(
                    f"the checkpoint's optimizer state does not fit this optimizer and "
                    f"model. Received: {key}"
                )
            for name, value in parts.items():
                var = held[names.index(name)]
                var.assign(self.conversion.to_keras(name, value, var.dtype.name))
        self.applied.assign(state.applied)
        if self.fp16:
            self.scale.assign(state.loss_scale)
            self.good_steps.assign(state.good_steps)
