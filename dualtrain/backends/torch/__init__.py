"""PyTorch backend: DistributedDataParallel (gloo on CPU, nccl on GPU), autocast + GradScaler.

Import ``dualtrain.backends.torch.runner`` for the worker side; ``launch`` is framework-free.
"""
