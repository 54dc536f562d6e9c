"""MultiWorkerMirroredStrategy for examples/audit/keras_mnist.py --multi-worker N: the workers on
localhost, and the two fixes Keras 3's ``fit`` needs under that strategy (docs/audit.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import tensorflow as tf


def multi_worker_fixes(strategy: tf.distribute.Strategy) -> None:
    """Two fixes Keras 3's ``fit`` needs under MultiWorkerMirroredStrategy with 2+ workers (Keras
    3.15, TF 2.21; without them ``fit`` fails before its first step):

    1. fit reads a first batch's shapes with ``strategy.reduce("MEAN", (x, y))``; MirroredStrategy
       reduces such a nest value by value, MWMS's collective reduce does not ("Attempt to convert
       a value (PerReplica...) with an unsupported type"): reduce it value by value;
    2. fit averages the replicas' logs with ``strategy.reduce("MEAN", v, axis=0)``, which fails on
       the scalar losses and metrics ("Invalid reduction dimension 0 for input with 0
       dimensions"): average them over the replicas (``axis=None``).
    """
    from keras.src.backend.tensorflow import trainer

    reduce_to = strategy.extended._reduce_to
    strategy.extended._reduce_to = lambda op, value, dest, options: tf.nest.map_structure(
        lambda v: reduce_to(op, v, dest, options), value
    )
    per_replica = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction == "auto" and trainer._collective_all_reduce_multi_worker(strategy):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return per_replica(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica


def launch_workers(n: int) -> None:
    """Start this script as ``n`` MultiWorkerMirroredStrategy workers on localhost; wait for all."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    procs = []
    for i in range(n):
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(
            subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "TF_CONFIG": config})
        )
    while any(p.poll() is None for p in procs):  # one worker failed: its peers would wait on
        if any(p.poll() for p in procs):  # its collectives for ever, so they are stopped
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.2)
    codes = [p.returncode for p in procs]
    if any(codes):
        sys.exit(f"a worker failed: exit codes {codes}")
