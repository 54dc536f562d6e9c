"""Keras layers for porting PyTorch models: what a faithful Keras port of a torch layer needs when
Keras has no layer with torch's semantics. Import them in your Keras model
(``from dualtrain.backends.tf.port import TorchBatchNormalization``); they are plain Keras 3
layers, so the port trains with them outside dualtrain too (docs/own-models.md).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from dualtrain.core import batchnorm

from .layers import batchnorm_ops


@keras.saving.register_keras_serializable(package="dualtrain")
class TorchBatchNormalization(keras.layers.BatchNormalization):
    """``nn.BatchNorm1d/2d`` in Keras (channels last): torch's ``momentum`` (the weight of the new
    batch statistic: ``running = (1 - momentum) * running + momentum * batch``) and ``eps``, and
    the running variance from the **unbiased** batch variance, where Keras's BatchNormalization
    keeps the biased one and takes ``momentum`` as the weight of the old value. The arithmetic is
    dualtrain.core.batchnorm's, as dualtrain's own batchnorm layer computes it. Its weights are
    BatchNormalization's (gamma, beta, moving_mean, moving_variance), and in inference it is the
    same (a dualtrain export saves a BatchNormalization)."""

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, **kwargs: Any) -> None:
        kwargs.pop("epsilon", None)
        kwargs.pop("axis", None)
        super().__init__(axis=-1, momentum=1.0 - momentum, epsilon=eps, **kwargs)
        self.torch_momentum, self.eps = float(momentum), float(eps)

    def call(
        self, inputs: tf.Tensor, training: bool | None = None, mask: tf.Tensor | None = None
    ) -> tf.Tensor:
        x = inputs
        low = x.dtype in (tf.float16, tf.bfloat16)
        if low:  # statistics and normalisation in float32, as Keras's BatchNormalization
            x = tf.cast(x, tf.float32)
        ops = batchnorm_ops(x)
        if training and self.trainable:
            mean, var, unbiased = batchnorm.batch_stats(ops, x, False)
            m = self.torch_momentum
            self.moving_mean.assign(batchnorm.update_running(self.moving_mean.value, mean, m))
            self.moving_variance.assign(
                batchnorm.update_running(self.moving_variance.value, unbiased, m)
            )
        else:
            mean, var = self.moving_mean.value, self.moving_variance.value
        y = batchnorm.normalize(ops, x, mean, var, self.gamma.value, self.beta.value, self.eps)
        return tf.cast(y, inputs.dtype) if low else y

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        for key in ("momentum", "epsilon", "axis"):
            config.pop(key, None)
        return {**config, "momentum": self.torch_momentum, "eps": self.eps}

    def as_keras(self) -> keras.layers.BatchNormalization:
        """The same layer in inference as Keras's own BatchNormalization (for an export that
        loads without dualtrain)."""
        config = keras.layers.BatchNormalization.get_config(self)
        return keras.layers.BatchNormalization.from_config(config)
