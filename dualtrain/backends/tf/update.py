"""The update on the tf backend once the gradients are summed: fp16's unscale and finite check, the
global norm and clipping (dualtrain.core.update_rules), torch.optim's update of every parameter
(on every device's copy, or skipped on every device), the applied-step counter and GradScaler's
dynamic loss-scale rule. The same methods serve the mirrored step (step.py) and the parameter
server's apply (ps.py). A part of :class:`~dualtrain.backends.tf.engine.TFEngine`."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from dualtrain.core import update_rules

from .state import TFState


class GradientUpdate:
    """The update once the gradients are summed, in the mirrored step or on the parameter
    server."""

    def __init__(self, state: TFState):
        self.state = state

    def after_reduce(
        self, grads: list[tf.Tensor], scale: tf.Tensor, *, capture: bool
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """What follows the SUM of the gradients, the same in the mirrored step and on the
        parameter server: fp16's unscale, its finite check and the largest |element| (fp16 skips on
        every replica when the summed gradient is not finite, GradScaler's check; fp32/bf16 never
        skip, as torch without a GradScaler); the global norm (torch.nn.utils.clip_grad_norm_: the
        L2 norm of the per-tensor L2 norms); the captured gradient (``capture``); clipping.
        Returns (clipped gradient, norm, finite, amax, captured)."""
        if self.state.fp16:
            grads = self.unscale(grads, scale)
            finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
            amax = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(g)) for g in grads]))
        else:
            finite, amax = tf.constant(True), tf.constant(0.0, self.state.dtype)
        norm = update_rules.global_norm(self.state.ops, grads)
        captured = list(grads) if capture else []
        grads = update_rules.clip(self.state.ops, grads, norm, self.state.opt.clip_grad_norm)
        return grads, norm, finite, amax, captured

    def unscale(self, grads: Sequence[tf.Tensor], scale: tf.Tensor) -> list[tf.Tensor]:
        """fp16: the all-reduced gradient divided by the loss scale (GradScaler's unscale_: a
        multiplication by the float32 reciprocal)."""
        inv = tf.constant(1.0, tf.float32) / scale
        return [g * inv for g in grads]

    def apply_one(
        self, p: tf.Variable, g: tf.Tensor, apply: tf.Tensor, lr: tf.Tensor, k: int
    ) -> tf.Operation:
        """torch.optim's update of parameter k (runs once per device, on that device's copies)."""

        def update() -> list[tf.Operation]:
            slots = {key: held[k] for key, held in self.state.optimizer.slots.items() if held}
            new_p, new_slots = update_rules.update(
                self.state.ops, self.state.opt, p, g, slots, lr=lr, applied=self.state.applied
            )
            return [
                *(slots[key].assign(value) for key, value in new_slots.items()),
                p.assign(new_p),
            ]

        # only fp16 ever skips; a tf.cond per variable and device costs time
        if not self.state.fp16:
            return tf.group(update())
        return tf.cond(apply, lambda: tf.group(update()), tf.no_op)

    def bookkeeping(self, applied: tf.Variable, ok: tf.Tensor) -> tf.Operation:
        """Applied-step counter and GradScaler's dynamic loss-scale rule (per device copy)."""
        ops = [applied.assign_add(tf.cast(ok, tf.int64))]
        if self.state.fp16:
            st = self.state
            scale, good = update_rules.loss_scale_update(
                st.ops, st.scale, st.good_steps, ok, st.spec.precision.loss_scale
            )
            ops += [st.scale.assign(scale), st.good_steps.assign(good)]
        return tf.group(ops)
