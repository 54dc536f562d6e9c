"""dualtrain: one experiment spec, two distributed training runs (PyTorch and TensorFlow/Keras 3).

The top-level package is framework-free: it never imports torch, tensorflow or keras. Backends live
in ``dualtrain.backends.torch`` and ``dualtrain.backends.tf`` and run in their own processes.
"""

__version__ = "0.1.0"
