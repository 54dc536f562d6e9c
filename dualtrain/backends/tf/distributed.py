"""A TF process's set-up before its engine: its role in the run (one MirroredStrategy process over
local devices, or one task of a TF_CONFIG cluster), the process-wide settings TensorFlow reads at
its import (determinism, oneDNN, threads, cores), and the strategy."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

from dualtrain.errors import UserError
from dualtrain.launch import forkserver
from dualtrain.runtime import clock
from dualtrain.runtime.start import bind_cores, default_threads
from dualtrain.spec import Device, Experiment, Strategy, TFStrategy

from .launch import (
    BASE_PREIMPORT,
    LOCAL_ONLY,
    TF_CONFIG,
    parse_tf_config,
    preimport_env,
)


def _say(text: str, rank: int = 0) -> None:
    if rank == 0:
        print(f"[tf] {text}", flush=True)


@dataclass(frozen=True)
class Role:
    """This process in the run: one MirroredStrategy process over local devices, or one task of a
    TF_CONFIG cluster (``external``: a cluster dualtrain did not launch)."""

    multi_worker: bool
    rank: int
    num_processes: int
    local_workers: int
    external: bool


@dataclass(frozen=True)
class Configured:
    """TensorFlow as configured for this process: the strategy, the host device, the replicas'
    devices and the intra-op thread count."""

    strategy: Any
    host: str
    devices: list[str]
    threads: int
    coordinator: Any = None
    """distribution.strategy: parameter_server: the chief's ClusterCoordinator."""


def plan_process(spec: Experiment) -> tuple[Experiment, Role]:
    """Decide this process's role from the spec and the environment (no TF import); return the
    effective spec and the role. Inside an external TF_CONFIG cluster the cluster defines the
    replicas (one per task), so a ``mirrored`` spec runs as ``multi_worker`` there."""
    text = os.environ.get(TF_CONFIG, "").strip()
    ours = os.environ.get(LOCAL_ONLY) == "1"
    if spec.distribution.strategy is Strategy.PARAMETER_SERVER:
        # the chief of the cluster dualtrain launched: the one process that runs the loop
        return spec, Role(
            multi_worker=False, rank=0, num_processes=1, local_workers=1, external=False
        )
    if spec.tf.strategy is TFStrategy.MIRRORED and (not text or ours):
        os.environ.pop(TF_CONFIG, None)
        return spec, Role(
            multi_worker=False, rank=0, num_processes=1, local_workers=1, external=False
        )
    if not text:
        raise UserError(
            "tf.strategy=multi_worker needs TF_CONFIG: run it through `dualtrain run` (which "
            "launches the workers) or inside a TF_CONFIG cluster. Received: no TF_CONFIG"
        )
    info = parse_tf_config(text)
    if spec.tf.strategy is TFStrategy.MIRRORED:
        _say(
            f"TF_CONFIG is set ({info.world_size} tasks): running tf.strategy=multi_worker, one "
            f"replica per task (mirrored is one process over its local devices)",
            info.rank,
        )
        spec = spec.replace(tf=dataclasses.replace(spec.tf, strategy=TFStrategy.MULTI_WORKER))
    if info.world_size != spec.distribution.world_size:
        raise UserError(
            f"distribution.world_size must equal the TF_CONFIG cluster size "
            f"{info.world_size}. Received: {spec.distribution.world_size}"
        )
    local = spec.distribution.world_size if ours else 1
    return spec, Role(
        multi_worker=True,
        rank=info.rank,
        num_processes=info.world_size,
        local_workers=local,
        external=not ours,
    )


def configure_tf(spec: Experiment, role: Role) -> Configured:
    """Everything that must happen before TensorFlow initialises its runtime."""
    threads = settings(spec, role.local_workers, role.rank if role.local_workers > 1 else 0)
    import tensorflow as tf  # lazy: framework (settings() first)

    tf.config.set_soft_device_placement(False)
    world = spec.distribution.world_size
    gpus = tf.config.list_physical_devices("GPU")
    timeout = spec.distribution.timeout_s
    if spec.distribution.strategy is Strategy.PARAMETER_SERVER:
        from .ps import strategy_for  # lazy: framework

        # functions the chief sends to the workers name "/device:CPU:0" somewhere (Keras), which
        # a cluster of several tasks resolves only with soft placement
        tf.config.set_soft_device_placement(True)
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        strategy, coordinator = strategy_for(json.loads(os.environ[TF_CONFIG])["cluster"])
        host = tf.config.list_logical_devices("CPU")[0].name
        return Configured(strategy, host, [host], threads, coordinator)
    if spec.distribution.device is Device.GPU and not gpus:
        raise UserError("distribution.device=gpu but TensorFlow sees no GPU. Received: device=gpu")
    if not role.multi_worker:
        if spec.distribution.device is Device.GPU:
            if len(gpus) < world:
                raise UserError(
                    f"tf.strategy=mirrored with device=gpu needs world_size GPUs; "
                    f"TensorFlow sees {len(gpus)}. Received: world_size={world}"
                )
            tf.config.set_visible_devices(gpus[:world], "GPU")
            devices = [f"/gpu:{i}" for i in range(world)]
        else:
            if gpus:
                tf.config.set_visible_devices([], "GPU")
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(world)]
            )
            devices = [f"/cpu:{i}" for i in range(world)]
        cross = (
            tf.distribute.NcclAllReduce()
            if spec.distribution.device is Device.GPU and world > 1
            else tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")
        )
        strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
        host = tf.config.list_logical_devices("CPU")[0].name
        return Configured(strategy, host, devices, threads)
    # multi_worker: one replica per process.
    if spec.distribution.device is Device.GPU:
        local_rank = int(
            os.environ.get("DUALTRAIN_TF_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
        )
        tf.config.set_visible_devices([gpus[local_rank % len(gpus)]], "GPU")
    elif gpus:
        tf.config.set_visible_devices([], "GPU")
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=(
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if spec.distribution.device is Device.GPU
            else tf.distribute.experimental.CommunicationImplementation.RING
        ),
        timeout_seconds=timeout,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # TF's multi-worker runtime installs a SIGTERM handler (its preemption notifier, for
    # PreemptionCheckpointHandler) that notes the signal and lets training go on: a worker then
    # ignored `kill`, `docker stop`, a scheduler's preemption and its launcher's stop. dualtrain
    # handles preemption with its own checkpoints and --resume, so SIGTERM stops the worker at once,
    # as it does a torch worker.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    host = [d.name for d in tf.config.list_logical_devices("CPU")][0]
    return Configured(strategy, host, list(strategy.extended.worker_devices), threads)


def settings(spec: Experiment, local_workers: int, local_rank: int = 0) -> int:
    """The process-wide settings of every TF process of a run, before and right after
    TensorFlow's import: determinism, oneDNN, threads (cores // local_workers unless
    distribution.threads_per_worker) and this process's cores (distribution.bind_cores), TF32
    and XLA off. Returns the intra-op thread count."""
    for key, value in BASE_PREIMPORT.items():
        os.environ.setdefault(key, value)
    if spec.determinism:
        os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")
        # oneDNN picks kernels by batch size, so one sample's logits change in the last bits with
        # the batch it shares (~1e-6 relative on the CNN): a world-size-1 run and a world-size-3 run
        # would then not compute the same per-sample gradients. Eigen's kernels do (and are as fast
        # here). bf16 is the exception: Eigen's bf16 matmul rounds about twice as coarsely as
        # oneDNN's, and oneDNN's is the one torch uses (bitwise-equal outputs on a 64x784x256 probe,
        # max rel err 2.7e-3 vs Eigen's 5.7e-3), so bf16 keeps oneDNN to stay close to torch.
        # An explicit TF_ENABLE_ONEDNN_OPTS in the environment wins.
        late = {k: v for k, v in preimport_env(spec).items() if k not in os.environ}
        if late and "tensorflow" in sys.modules and not forkserver.imported_with(late):
            print(
                f"dualtrain: warning: TensorFlow was imported before this worker could set {late} "
                "(a launcher that imports it first, as Ray Train's TensorflowTrainer does): give "
                "the launcher's workers that environment (dualtrain.backends.tf.launch."
                "preimport_env; examples/ray/train.py)",
                file=sys.stderr,
                flush=True,
            )
        for key, value in late.items():
            os.environ[key] = value
    import tensorflow as tf  # lazy: framework (the environment first)

    clock.mark("framework")
    threads = spec.distribution.threads_per_worker or default_threads(local_workers)
    bind_cores(spec, local_rank, local_workers, threads)  # before TF's runtime starts a thread
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    if spec.determinism:
        tf.config.experimental.enable_op_determinism()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tf.config.optimizer.set_jit(False)
    return threads
