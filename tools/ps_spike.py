"""The parameter-server spike (docs/strategies.md): does a *synchronous* parameter-server step mean
what dualtrain's all-reduce step means, on both backends, in float64?

It replays a finished fp64 ``dualtrain run`` (RUN_DIR: its spec, data statistics, initial weights,
sharding plan and the lr of every step from metrics.jsonl) as a synchronous parameter-server job on
this machine, then compares its final weights with RUN_DIR/weights_final.npz:

``tf``
    A localhost cluster of real processes: W ``tf.distribute.Server`` workers and P parameter
    servers, the coordinator (chief) in this process. ``ParameterServerStrategy`` places the Keras 3
    model's variables on the parameter servers; every step, ``ClusterCoordinator.schedule`` sends
    each replica's shard (the plan's ids) to whichever worker is free, which computes
    ``sum(per-sample loss) / N_global``'s gradient against the parameter servers' variables;
    ``join`` waits for all of them (the synchronous barrier), the gradients are summed in replica
    order and one update (dualtrain.core.update_rules on the TF namespace) is applied to the
    variables on the parameter servers.
``torch``
    ``torch.distributed.rpc`` (TensorPipe), the pattern of PyTorch's batch-updating
    parameter-server tutorial: rank 0 is the parameter server holding the model and a
    ``torch.optim.SGD``; W trainer processes each compute their shard's gradient and send it with
    ``rpc_sync`` to an ``@rpc.functions.async_execution`` method that waits for all W, sums them in
    rank order, steps the optimizer and answers every trainer with the new weights.

``--plant mean_of_means`` plants the semantic defect a parameter-server script most often has
(Horovod's and the RPC tutorials' convention): every replica normalises its loss by its own sample
count and the server averages the W gradients. With uneven shards (128 samples over 3 replicas:
43, 43, 42) that is not the global batch's mean, and the comparison must fail.

Usage (RUN_DIR from ``dualtrain run --set precision.dtype=fp64 ...``; sgd only)::

    python -m tools.ps_spike tf RUN_DIR [--ps 2] [--plant mean_of_means]
    python -m tools.ps_spike torch RUN_DIR [--plant mean_of_means]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dualtrain.core import update_rules
from dualtrain.core.model import keras_layouts
from dualtrain.core.weights import load_weights
from tools.ps_spike_common import free_ports, load_replay, normaliser, print_report, server_factor


def _tf_server(cluster_json: str, job: str, index: int) -> None:
    import tensorflow as tf  # lazy: framework

    server = tf.distribute.Server(
        tf.train.ClusterSpec(json.loads(cluster_json)),
        job_name=job,
        task_index=index,
        protocol="grpc",
        start=True,
    )
    server.join()


def run_tf(run_dir: Path, n_ps: int, plant: str | None = None) -> None:
    spec, data, steps, lrs = load_replay(run_dir)
    world = spec.distribution.world_size
    ports = free_ports(1 + world + n_ps)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{p}" for p in ports[1 : 1 + world]],
        "ps": [f"127.0.0.1:{p}" for p in ports[1 + world :]],
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    servers = [
        subprocess.Popen(
            [sys.executable, __file__, "_tf_server", json.dumps(cluster), job, str(i)], env=env
        )
        for job in ("worker", "ps")
        for i in range(len(cluster[job]))
    ]
    try:
        _tf_coordinator(spec, data, steps, lrs, cluster, run_dir, plant)
    finally:
        for s in servers:
            s.kill()


def _tf_coordinator(spec, data, steps, lrs, cluster, run_dir, plant) -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf  # lazy: framework (TF_CPP_MIN_LOG_LEVEL first)

    from dualtrain.backends.tf.model import (  # lazy: framework
        build_model,
        export_canonical,
        load_canonical,
        to_nhwc,
    )
    from dualtrain.backends.tf.ops import OPS  # lazy: framework

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model, named = build_model(spec.model, "float64", seed=spec.seed)
        load_canonical(named, load_weights(run_dir / "weights_init.npz"), keras_layouts(spec.model))
        variables = [v for _, v in named]
        bufs = [tf.Variable(tf.zeros(v.shape, tf.float64), trainable=False) for v in variables]
        applied = tf.Variable(0, dtype=tf.int64, trainable=False)
    placed = sorted({v.value.device if hasattr(v, "value") else v.device for v in variables})
    print("variables on:", placed, file=sys.stderr)

    @tf.function
    def shard_gradient(x, y, normaliser):
        def replica(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_sum(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                )
                scaled = loss / normaliser
            return tape.gradient(scaled, [v.value for v in variables]), loss

        return strategy.run(replica, args=(x, y))

    @tf.function
    def apply(grads, lr):
        for v, b, g in zip(variables, bufs, grads, strict=True):
            p, slots = update_rules.update(
                OPS, spec.optimizer, v.value, g, {"momentum_buffer": b}, lr=lr, applied=applied
            )
            v.assign(p)
            if "momentum_buffer" in slots:
                b.assign(slots["momentum_buffer"])
        applied.assign_add(1)

    t0 = time.perf_counter()
    factor = server_factor(len(steps[0]), plant)
    for ids_per_replica, lr in zip(steps, lrs, strict=True):
        remote = []
        for r, ids in enumerate(ids_per_replica):
            x = tf.constant(to_nhwc(data.inputs("train", ids)[0], "float64"))
            y = tf.constant(data.targets("train", ids))
            n = tf.constant(normaliser(ids_per_replica, r, plant), tf.float64)
            remote.append(coordinator.schedule(shard_gradient, args=(x, y, n)))
        coordinator.join()  # the synchronous barrier: every shard's gradient is in
        fetched = [r.fetch() for r in remote]
        total = [tf.constant(g) for g in fetched[0][0]]
        for grads, _ in fetched[1:]:  # replica order, whatever worker ran it
            total = [t + tf.constant(g) for t, g in zip(total, grads, strict=True)]
        if factor != 1.0:
            total = [t * factor for t in total]
        apply(total, tf.constant(lr, tf.float64))
    seconds = time.perf_counter() - t0
    final = {
        k: np.asarray(v) for k, v in export_canonical(named, keras_layouts(spec.model)).items()
    }
    print_report("tf", run_dir, final, seconds, len(lrs))


def run_torch(run_dir: Path, plant: str | None = None) -> None:
    from tools import ps_spike_torch  # lazy: framework (imports torch: only for the torch half)

    ps_spike_torch.run(run_dir, plant)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_tf_server":
        _tf_server(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backend", choices=["tf", "torch"])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--ps", type=int, default=1, help="parameter servers (tf)")
    ap.add_argument("--plant", choices=["mean_of_means"], default=None)
    a = ap.parse_args()
    if a.backend == "tf":
        run_tf(a.run_dir, a.ps, a.plant)
    else:
        run_torch(a.run_dir, a.plant)


if __name__ == "__main__":
    main()
