"""Runtime: one worker process's training, shared by both backends (framework-free).

``loop``: the training-loop policy (:class:`~dualtrain.runtime.loop.TrainLoop`) and the
:class:`~dualtrain.runtime.loop.Engine` contract each backend implements; ``entry``: the worker
skeleton both backends' ``__main__`` call; ``checkpoint``, ``probes``, ``progress``: what a worker
saves, measures and prints.
"""
