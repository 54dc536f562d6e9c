"""Runtime: one worker process's training, shared by both backends (framework-free).

``engine``: the :class:`~dualtrain.runtime.engine.Engine` contract each backend implements;
``start``: where a worker starts (fresh or a checkpoint); ``loop``: the training-loop policy
(:class:`~dualtrain.runtime.loop.TrainLoop`); ``entry``: the worker skeleton both backends'
``__main__`` call; ``checkpoint``, ``probes``, ``progress``: what a worker saves, measures and
prints.
"""
