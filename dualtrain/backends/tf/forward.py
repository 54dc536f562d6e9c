"""The forward and the sums taken from it on the tf backend: one micro-batch's forward, loss sum and
gradient on a replica (what the step's replica function runs per micro-batch: step.py), the loss
and the metric sums of dualtrain.core.losses, and evaluation (the model in inference, a chunk at a
time, on the host). A part of :class:`~dualtrain.backends.tf.engine.TFEngine`, on its
:class:`TFState`."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from dualtrain.core import losses
from dualtrain.core.data import TRAIN
from dualtrain.core.model import forward_order, resolve
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.core.pair.attention import zero_gradients
from dualtrain.core.pair.record import Layout
from dualtrain.runtime.engine import Evaluation

from .mapping import engine_names
from .model import Conversion, call_model
from .ops import LOSS_OPS
from .state import TFState


class ForwardPass:
    """The forward and what is summed from it: a micro-batch's forward and gradient on a
    replica, the losses, the layer taps, evaluation."""

    def __init__(self, state: TFState):
        self.state = state
        self.eval_fn: Callable[..., tuple[tf.Tensor, tf.Tensor]] = self.evaluate_chunk

    def trace_eval(self, signature: list[tf.TensorSpec] | None) -> None:
        """Evaluation's chunk as a traced function (of this signature where given)."""
        self.eval_fn = tf.function(
            self.evaluate_chunk, input_signature=signature, jit_compile=False, autograph=False
        )

    def call(
        self,
        x: list[tf.Tensor],
        ids: tf.Tensor | None = None,
        step: tf.Tensor | None = None,
        training: bool = False,
    ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(logits, batchnorm statistics); see model.call_model. A model pair's training forward
        gives its dropout layers the pair's masks of this step and these sample ids
        (dualtrain.core.pair.dropout: traced here, in this replica's thread)."""
        if training and self.state.layout is not None and self.state.layout.dropouts:
            assert ids is not None and step is not None  # a training forward has both
            with pair_dropout.training_forward(
                "keras",
                self.state.layout.dropouts,
                self.state.spec.seed,
                tf.cast(step, tf.int64),
                tf.cast(ids, tf.int64),
            ):
                return call_model(self.state.model, x, dropout=False, training=True)
        return call_model(
            self.state.model, x, dropout=self.state.dropout, ids=ids, step=step, training=training
        )

    def micro_step(
        self,
        ids: tf.Tensor,
        x: list[tf.Tensor],
        y: tf.Tensor,
        global_count: tf.Tensor,
        step: tf.Tensor,
        scale: tf.Tensor,
        capture: bool = False,
    ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor], tf.Tensor | None]:
        """One micro-batch on this replica: (its loss sum, its batchnorm statistics, the gradient
        of sum(loss) / global_count, times the loss scale under fp16, and with ``capture`` (a
        probe) the exact loss of its own outputs: the same losses in float64, which the probes'
        loss-path check holds the loss sum to; else None)."""

        def forward() -> list[tf.Tensor]:
            logits, stats = self.call(x, ids, step, True)
            own = [tf.stop_gradient(self.loss_exact(logits, y))] if capture else []
            return [self.loss_sum(logits, y), *own, *(tf.stop_gradient(t) for t in stats)]

        # an empty replica (models without sync batchnorm): no forward at all
        def skipped() -> list[tf.Tensor]:
            return [
                tf.constant(0.0, self.state.dtype),
                *([tf.constant(0.0, tf.float64)] if capture else []),
                *(
                    tf.zeros(r.shape, r.dtype)
                    for r in self.state.running
                    if self.state.layout is None
                ),
            ]

        with tf.GradientTape() as tape:
            # An empty replica contributes zero loss and zero gradient. Dense layers get there by
            # themselves (a 0-row matmul); convolutions are not run on an empty batch (oneDNN's
            # fused conv kernels reject one). The guard is a tf.cond, which costs time in every step
            # (and its gradient), so only models with convolutions have it.
            if self.state.guard_empty:
                loss_sum, *stats = tf.cond(tf.size(ids) > 0, forward, skipped)
            else:
                loss_sum, *stats = forward()
            own = stats.pop(0) if capture else None
            loss = loss_sum / tf.cast(global_count, self.state.dtype)
            if self.state.fp16:
                loss = loss * scale
        grads = tape.gradient(
            loss, self.state.params, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        # a Keras Embedding's gradient (tf.gather's) is IndexedSlices: dense, as torch's is (the
        # rows of repeated ids summed), so every gradient is one array per variable
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        grads = [
            g if m is None else g * tf.constant(m, g.dtype)
            for g, m in zip(grads, self.gradient_masks(), strict=True)
        ]
        return loss_sum, stats, grads, own

    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None:
        """debug.dump_layers (dualtrain.parity.taps): every layer's output on these samples before
        this step's update, in training (this step's dropout masks, the batch's statistics) and in
        inference, and each sample's loss, in torch's layouts (NCHW). None for a model pair, and
        for synchronised batchnorm across replicas (its statistics are the whole batch's)."""
        if self.state.layout is not None or (
            self.state.strategy.num_replicas_in_sync > 1
            and any(sync for _, sync in self.state.norms)
        ):
            return None
        prefixes = [
            r.prefix
            for r in forward_order(resolve(self.state.spec.model))
            if r.prefix in self.state.taps
        ]
        tapped = keras.Model(
            self.state.model.input,
            [*self.state.model.outputs, *(self.state.taps[p] for p in prefixes)],
        )
        *xs, y = self.state.feed(TRAIN, ids)
        nchw = [np.transpose(x, (0, 3, 1, 2)) if x.ndim == 4 else x for x in xs]
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int64), "y": y}
        out.update({f"input/{k}": x for k, x in enumerate(nchw)})
        model, self.state.model = (
            self.state.model,
            tapped,
        )  # the engine's own forward, with the taps out
        try:
            for tag, training in (("train", True), ("eval", False)):
                logits, rest = self.call(
                    [tf.constant(x) for x in xs],
                    tf.constant(ids, tf.int64) if training else None,
                    tf.constant(step, tf.int64) if training else None,
                    training,
                )
                for p, t in zip(prefixes, rest[len(model.outputs) - 1 :], strict=True):
                    a = t.numpy()
                    out[f"{tag}/{p}"] = np.transpose(a, (0, 3, 1, 2)) if a.ndim == 4 else a
                out[f"{tag}/output"] = logits.numpy()
                out[f"{tag}/loss"] = np.array(
                    [float(self.loss_sum(logits[i : i + 1], y[i : i + 1])) for i in range(len(y))]
                )
        finally:
            self.state.model = model
        return out

    def gradient_masks(self) -> list[np.ndarray | None]:
        """zero_masks of this engine's trainable variables (all None for dualtrain's own layers)."""
        if self.state.layout is None:
            return [None] * len(self.state.params)
        return zero_masks(self.state.conversion, self.state.layout, self.state.param_names)

    def loss_sum(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """Sum of per-sample losses (dualtrain.core.losses) in the parameter dtype (float32;
        float64 for fp64), whatever precision the logits came out in (docs/parity.md §3)."""
        return self.sum_losses(tf.cast(logits, self.state.dtype), y)

    def loss_exact(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """The same sum in float64 on the same outputs (exact to float64 rounding): what the probes'
        loss-path check holds :meth:`loss_sum` to (dualtrain.parity.local)."""
        return self.sum_losses(tf.cast(logits, tf.float64), y)

    def sum_losses(self, out: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return losses.loss_sum(LOSS_OPS, self.state.loss, out, y)

    def metric_sum(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """The evaluation metric summed over these samples (dualtrain.core.losses)."""
        return losses.metric_sum(LOSS_OPS, self.state.loss, tf.cast(logits, self.state.dtype), y)

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluate_chunk(self, *batch: tf.Tensor) -> tf.Tensor:
        """(loss sum, metric sum) of one chunk, float64, on the host: the model in inference
        reads the variables' (identical) values outside any replica, so evaluation needs no
        collective until its sums are added over the processes."""
        logits = tf.cast(self.call(list(batch[:-1]))[0], self.state.dtype)
        loss = tf.cast(self.loss_sum(logits, batch[-1]), tf.float64)
        sums = tf.stack([loss, self.metric_sum(logits, batch[-1])])
        hit = losses.correct(LOSS_OPS, self.state.loss, logits, batch[-1])
        return sums, (tf.zeros([0], tf.uint8) if hit is None else tf.cast(hit, tf.uint8))

    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation:
        if len(ranges) != self.state.n_local:
            raise ValueError(f"expected {self.state.n_local} eval ranges, got {len(ranges)}")
        sums = np.zeros(3)
        right = []
        with tf.device(self.state.host):
            for start, stop in ranges:
                for s in range(start, stop, self.state.eval_chunk):
                    e = min(s + self.state.eval_chunk, stop)
                    chunk, hit = self.eval_fn(*self.state.feed(split, slice(s, e)))
                    loss, metric = chunk.numpy()
                    sums += (loss, metric, e - s)
                    right.append(hit.numpy())
        loss_sum, metric_sum, count = self.state.gather(sums).sum(axis=0).tolist()
        labels = losses.LOSSES[self.state.loss].labels  # correct() gave per-sample results
        correct = np.concatenate(right) if right and labels else None
        return Evaluation(loss_sum=loss_sum, metric_sum=metric_sum, count=count, correct=correct)


def zero_masks(conversion: Conversion, layout: Layout, names: list[str]) -> list[np.ndarray | None]:
    """Per trainable variable (the engine's ``names``): None, or a 0/1 mask in its Keras layout
    that zeroes the gradient where its exact value is zero (dualtrain.core.pair.attention
    .zero_gradients: the key's bias of nn.MultiheadAttention, the whole key bias of a Keras
    MultiHeadAttention); the torch side's hooks do the same (backends/torch/pair.py)."""
    shapes = layout.shapes()
    masks: dict[str, np.ndarray] = {}
    for name, (start, stop) in zero_gradients(layout.torch.torch).items():
        whole = np.ones(shapes[name])
        whole[start:stop] = 0.0
        for part, value in engine_names(conversion, {name: whole}).items():
            masks[part] = conversion.to_keras(part, value)
    return [masks.get(n) for n in names]
