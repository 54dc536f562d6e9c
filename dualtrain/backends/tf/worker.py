"""The tf worker: configure TensorFlow before it initialises, build the strategy, train.

``run_worker(spec, run_dir)`` is called by ``python -m dualtrain.backends.tf RUN_DIR`` (workers
dualtrain launched) and by ``dualtrain run`` itself inside an external TF_CONFIG cluster
(``run_dir`` is None on the non-chief workers there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualtrain.backends.tf import kernels as tf_kernels
from dualtrain.core import kernels
from dualtrain.launch.peers import is_comm_error, lost_peer
from dualtrain.records.envinfo import cpu_flags
from dualtrain.records.record import SPEC_FILE
from dualtrain.runtime import clock
from dualtrain.runtime.entry import worker_main
from dualtrain.runtime.start import Start
from dualtrain.runtime.worker import Begun, Inputs, train_loop, worker_inputs
from dualtrain.spec import Experiment, Strategy, TFStrategy, dump_spec

from .cluster import leave_together
from .distributed import Configured, Role, configure_tf, plan_process, settings
from .envinfo import backend_facts
from .launch import (
    ROLE_ENV,
    SERVER_ROLE,
    TF_CONFIG,
    cluster_peers,
)

if TYPE_CHECKING:  # the engine imports TensorFlow, which configure_tf must set up first
    from .engine import TFEngine


def run_worker(
    spec: Experiment,
    run_dir: str | Path | None,
    start: Start = Start(),  # noqa: B008 (Start is a frozen dataclass)
) -> dict[str, Any]:
    begun = Begun()  # the environment as given, before configure_tf sets anything (docs/env.md)
    if os.environ.get(ROLE_ENV) == SERVER_ROLE:
        return run_server(spec)
    spec, role = plan_process(spec)
    tf_ = configure_tf(spec, role)
    clock.mark("rendezvous")  # the strategy (its cluster, for multi_worker) is up
    import keras  # lazy: framework
    import tensorflow as tf  # lazy: framework

    keras.utils.set_random_seed(spec.seed)
    tf.random.set_seed(spec.seed)
    run_dir = Path(run_dir) if run_dir is not None else None
    if (
        run_dir is not None
        and role.rank == 0
        and role.external
        and spec.tf.strategy is TFStrategy.MULTI_WORKER
    ):
        (run_dir / SPEC_FILE).write_text(dump_spec(spec))  # record the strategy actually used
    inputs = worker_inputs(spec, run_dir, start, "tf")
    engine = make_engine(spec, role, tf_, inputs)
    facts = worker_facts(spec, role, tf_)
    loop = train_loop(
        spec,
        engine,
        inputs,
        run_dir,
        start,
        begun,
        chief=role.rank == 0,
        facts=facts,
        env={"tf": backend_facts()},
    )
    try:
        result = loop.run()
        if role.multi_worker:  # no task leaves while a peer still fetches its part (cluster.py)
            leave_together(role.rank, role.num_processes, spec.distribution.timeout_s)
        return result
    except (
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.InternalError,
    ) as exc:
        if not role.multi_worker or not is_comm_error(exc.message):
            raise
        raise lost_peer(
            "tf",
            role.rank,
            exc.message,
            cluster_peers(os.environ[TF_CONFIG]),
            timeout_s=spec.distribution.timeout_s,
            step=loop.step,
        ) from None


def make_engine(spec: Experiment, role: Role, tf_: Configured, inputs: Inputs) -> TFEngine:
    """This process's engine: the chief's of the parameter server (its replicas' gradients summed
    and applied on the server), else the strategy's replica engine."""
    from .engine import TFEngine  # lazy: framework

    if spec.distribution.strategy is Strategy.PARAMETER_SERVER:
        from .ps import PSEngine  # lazy: framework

        return PSEngine(
            spec,
            tf_.strategy,
            tf_.coordinator,
            inputs.data,
            inputs.weights,
            host_device=tf_.host,
            layout=inputs.layout,
        )
    return TFEngine(
        spec,
        tf_.strategy,
        inputs.data,
        inputs.weights,
        rank=role.rank,
        num_processes=role.num_processes,
        host_device=tf_.host,
        layout=inputs.layout,
    )


def worker_facts(spec: Experiment, role: Role, tf_: Configured) -> dict[str, Any]:
    """This process's facts for summary.json: the strategy, the devices and processes, the
    threads, oneDNN, and on the chief what its CPU's kernels do in the run's precision."""
    facts: dict[str, Any] = {
        "tf_strategy": (
            "parameter_server"
            if spec.distribution.strategy is Strategy.PARAMETER_SERVER
            else spec.tf.strategy.value
        ),
        "parameter_server": (
            "ParameterServerStrategy"
            if spec.distribution.strategy is Strategy.PARAMETER_SERVER
            else None
        ),
        "tf_devices": list(tf_.devices),
        "tf_processes": role.num_processes,
        "threads_per_worker": tf_.threads,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),  # distribution.bind_cores, or taskset's
        "tf_onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
    }
    from . import exact  # lazy: framework

    if exact.installed():  # a pair's fp64 run: where Keras's own op ran exactly (core.limits)
        facts["exact_ops"] = exact.report()
    if role.rank == 0:  # what this CPU's kernels do in the run's precision (summary.json)
        facts["kernels"] = kernels.for_run(
            spec.precision.dtype.value, tf_kernels.static_facts(cpu_flags()), tf_kernels.product
        )
    return facts


def run_server(spec: Experiment) -> dict[str, Any]:
    """A worker or parameter-server task of distribution.strategy: parameter_server: TensorFlow
    configured as the chief is (the kernels that compute the gradients run here), then a
    tf.distribute.Server until the launcher stops it once the chief is done."""
    # the W worker tasks compute the replicas' gradients side by side: each gets the threads an
    # all-reduce worker would (cores // W), so its kernels split their sums alike
    threads = settings(spec, spec.distribution.world_size)
    import tensorflow as tf  # lazy: framework (settings() first)

    from .ps import serve  # lazy: framework

    if tf.config.list_physical_devices("GPU"):
        tf.config.set_visible_devices([], "GPU")
    config = json.loads(os.environ[TF_CONFIG])
    serve(config["cluster"], config["task"]["type"], int(config["task"]["index"]), threads)
    return {}


def main(argv: list[str] | None = None) -> int:
    return worker_main("tf", sys.argv[1:] if argv is None else argv, run_worker)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
