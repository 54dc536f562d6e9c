"""Worker planning for the tf backend (framework-free: the CLI process imports it).

* ``tf.strategy: mirrored``: one worker process that drives ``world_size`` local devices.
* ``tf.strategy: multi_worker``: ``world_size`` worker processes, one replica each, wired together
  by ``TF_CONFIG`` on loopback ports.

Started inside a ``TF_CONFIG`` cluster (Kubeflow TFJob, Ray, a hand-written cluster spec) or as one
task of a multi-task ``srun`` step (dualtrain.launch.cluster builds the TF_CONFIG from Slurm's
variables), this process *is* one worker of that cluster: :func:`detect` reports its rank and the
cluster size. The cluster then defines the replicas (one per task), so such a run always uses
MultiWorkerMirrored: a spec that says ``mirrored`` is run as ``multi_worker`` (the worker says so
and records the strategy it used in spec.yaml and summary.json). ``mirrored`` means "one process,
its local devices"; a cluster of processes cannot be that.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from dualtrain.errors import UserError
from dualtrain.launch import cluster, slurm
from dualtrain.launch.child import require_gpu
from dualtrain.launch.cluster import TFTask
from dualtrain.launch.local import Worker, free_ports
from dualtrain.launch.peers import Peer
from dualtrain.spec import Experiment, Precision, Strategy, TFStrategy

UNIT = "worker"
MODULE = "dualtrain.backends.tf"
TF_CONFIG = "TF_CONFIG"
PRELOAD = (
    "tensorflow",
    "keras",
    "dualtrain.backends.tf.worker",
    "dualtrain.backends.tf.engine",
    "dualtrain.backends.tf.tools",
)
"""What a warm server imports (dualtrain.launch.forkserver): TensorFlow, Keras and the worker's
modules; none of them runs TensorFlow code at import (no context exists when the server forks)."""
BASE_PREIMPORT = {"TF_CPP_MIN_LOG_LEVEL": "2"}
"""Set before TensorFlow's import in every TF process, whatever the spec: its C++ start-up chatter
off (the workers' and tools' default)."""
ROLE_ENV = "DUALTRAIN_ROLE"
SERVER_ROLE = "tf_server"
"""distribution.strategy: parameter_server: a worker or parameter-server task (a
tf.distribute.Server), not the chief that runs the loop."""
LOCAL_ONLY = "DUALTRAIN_TF_LOCAL"
"""Set (to "1") on workers dualtrain launched itself: their TF_CONFIG (if any) is ours, not a
user's."""


STDERR_NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] "  # absl INFO lines (TF's C++ start-up)
    rb"|E\d{4} [^\]]* cuda_platform\.cc:\d+\] failed call to cuInit"  # a CUDA build, no GPU
    rb"|To enable the following instructions: "
)  # cpu_feature_guard's second line
"""TensorFlow's start-up chatter: ``TF_CPP_MIN_LOG_LEVEL`` does not reach absl's pre-initialisation
log lines in TF 2.16+. The launcher leaves these lines out of the workers' stderr (see
dualtrain.launch.local.run_workers); warnings and errors other than the cuInit probe still show."""


def parse_tf_config(text: str) -> TFTask:
    """TF_CONFIG -> this process's task; a "chief" task is rank 0."""
    try:
        cfg = json.loads(text)
        cluster = cfg["cluster"]
        task = cfg["task"]
        ttype, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"TF_CONFIG is not a valid cluster spec ({exc}). Received: {text!r}"
        ) from None
    chiefs = list(cluster.get("chief", []))
    workers = list(cluster.get("worker", []))
    if ttype not in ("chief", "worker"):
        raise UserError(
            f"TF_CONFIG task type must be 'chief' or 'worker' for dualtrain (no parameter "
            f"servers or evaluators). Received: {ttype!r}"
        )
    if len(chiefs) > 1:
        raise UserError(f"TF_CONFIG may name at most one chief. Received: {len(chiefs)}")
    size = len(chiefs) + len(workers)
    rank = 0 if ttype == "chief" else index + len(chiefs)
    if size < 1 or not 0 <= rank < size:
        raise UserError(
            f"TF_CONFIG task {ttype}:{index} is not in its cluster ({size} tasks). "
            f"Received: {text!r}"
        )
    return TFTask(rank=rank, world_size=size, task_index=index, chief=bool(chiefs))


def cluster_peers(text: str) -> list[Peer]:
    """The cluster's tasks as dualtrain.launch.peers.Peer, by rank (chief first), each also known by
    its TF task name, which TF's collective errors quote ("/job:worker/replica:0/task:1")."""
    spec = json.loads(text)["cluster"]
    tasks = [("chief", i, a) for i, a in enumerate(spec.get("chief", []))] + [
        ("worker", i, a) for i, a in enumerate(spec.get("worker", []))
    ]
    peers = []
    for rank, (kind, index, address) in enumerate(tasks):
        host = str(address).rsplit(":", 1)[0]
        peers.append(
            Peer(
                rank=rank,
                host=host,
                address=host,
                markers=(f"/job:{kind}/replica:0/task:{index}", str(address)),
            )
        )
    return peers


def detect(env: Mapping[str, str] | None = None) -> cluster.Launcher | None:
    """Which external cluster started this process as one worker, if any (reads, changes nothing):
    a TF_CONFIG (Kubeflow TFJob, a script) wins; else a multi-task srun step, for which
    dualtrain.launch.cluster builds the TF_CONFIG from Slurm's variables; else None."""
    env = os.environ if env is None else env
    if env.get(LOCAL_ONLY) == "1":  # a worker dualtrain launched: its TF_CONFIG is ours
        return None
    text = env.get(TF_CONFIG, "").strip()
    if text:
        return cluster.tf_config_launcher(parse_tf_config(text), json.loads(text))
    return slurm.slurm_launcher("tf", env)


def tf_config(ports: list[int], rank: int, addr: str = "127.0.0.1") -> str:
    return json.dumps(
        {
            "cluster": {"worker": [f"{addr}:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )


def workers(spec: Experiment) -> list[Worker]:
    n = spec.distribution.world_size
    if spec.distribution.strategy is Strategy.PARAMETER_SERVER:
        return server_cluster(spec)
    if spec.tf.strategy is TFStrategy.MIRRORED:
        # One process drives all local replicas; never inherit a stray cluster spec.
        return [Worker(rank=0, env={TF_CONFIG: "", LOCAL_ONLY: "1"})]
    addr = spec.distribution.master_addr
    ports = free_ports(n, addr)
    return [
        Worker(
            rank=r,
            env={
                TF_CONFIG: tf_config(ports, r, addr),
                LOCAL_ONLY: "1",
                "DUALTRAIN_TF_LOCAL_RANK": str(r),
            },
        )
        for r in range(n)
    ]


def server_cluster(spec: Experiment) -> list[Worker]:
    """distribution.strategy: parameter_server: the chief (worker 0: the loop, the run directory),
    then W worker tasks and one parameter-server task, tf.distribute.Servers the launcher stops
    once the chief is done (dualtrain.backends.tf.ps)."""
    n = spec.distribution.world_size
    addr = spec.distribution.master_addr
    ports = free_ports(n + 2, addr)
    cluster = {
        "chief": [f"{addr}:{ports[0]}"],
        "worker": [f"{addr}:{p}" for p in ports[1 : n + 1]],
        "ps": [f"{addr}:{ports[n + 1]}"],
    }

    def config(kind: str, index: int) -> str:
        return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})

    out = [Worker(rank=0, env={TF_CONFIG: config("chief", 0), LOCAL_ONLY: "1"})]
    for i in range(n):
        env = {TF_CONFIG: config("worker", i), LOCAL_ONLY: "1", ROLE_ENV: SERVER_ROLE}
        out.append(Worker(rank=1 + i, env=env, role=f"tf worker server {i}"))
    env = {TF_CONFIG: config("ps", 0), LOCAL_ONLY: "1", ROLE_ENV: SERVER_ROLE}
    out.append(Worker(rank=n + 1, env=env, role="parameter server"))
    return out


def check_devices(spec: Experiment) -> None:
    """A gpu run needs a GPU TensorFlow sees (dualtrain.launch.child.require_gpu)."""
    require_gpu(
        spec.distribution.device,
        "import os; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); "
        "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
        "TensorFlow sees no GPU",
    )


def preimport_env(spec: Experiment) -> dict[str, str]:
    """What a TF worker's environment must hold before TensorFlow is imported (the worker sets it
    itself unless it is set already; a launcher that imports TensorFlow before the worker runs,
    such as Ray Train's TensorflowTrainer, must pass it in): with determinism, oneDNN off (on for
    bf16: dualtrain.backends.tf.distributed.settings says why), and TF's C++ log level at 2 (its
    start-up chatter off; the worker's default, which TensorFlow reads when it first logs)."""
    out = dict(BASE_PREIMPORT)
    if spec.determinism:
        out["TF_ENABLE_ONEDNN_OPTS"] = "1" if spec.precision.dtype is Precision.BF16 else "0"
    return out
