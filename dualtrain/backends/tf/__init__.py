"""TensorFlow / Keras 3 backend: tf.distribute (MirroredStrategy or MultiWorkerMirroredStrategy)
with a custom ``strategy.run`` training loop that implements docs/architecture.md's step exactly.

Import ``dualtrain.backends.tf.worker`` for the worker side; ``launch`` is framework-free.
"""
