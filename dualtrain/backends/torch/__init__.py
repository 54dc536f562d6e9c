"""PyTorch backend: DistributedDataParallel (gloo on CPU, nccl on GPU), autocast + GradScaler.

Worker side: ``worker.run_worker`` (engine.py, model.py, precision.py); ``launch`` is
framework-free.
"""
