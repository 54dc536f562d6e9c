"""dualtrain's workers inside Ray Train, on a Ray cluster (a local one here): TorchTrainer for the
torch backend, TensorflowTrainer for the TF one (docs/clusters.md, "Ray Train").

torch: Ray starts the worker processes, sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) and creates the gloo process group itself; each worker then runs the
spec as `dualtrain run` does under torchrun and adopts that process group instead of creating a
second one. Ray owns the group and its timeout (TorchConfig.timeout_s, set here from the spec's
distribution.timeout_s).

TF: Ray sets a worker-only TF_CONFIG (worker 0 is the chief) and imports TensorFlow in its workers
before the training function runs, so what dualtrain's TF worker sets before that import (oneDNN
off, for determinism) comes through Ray's runtime_env; each worker runs the spec as in a TF_CONFIG
cluster (MultiWorkerMirroredStrategy, one process per replica).

Both: dualtrain owns restarts (Ray's max_failures is 0: rerunning the script continues the run
from its latest checkpoint); rank 0 writes the run directory, which every worker must see (one
machine here; a shared filesystem on a cluster).

    pip install -e '.[all,ray]' -c constraints.txt
    python examples/ray/train.py --backend torch configs/mnist_mlp.yaml runs/ray-torch
    python examples/ray/train.py --backend tf configs/mnist_mlp.yaml runs/ray-tf
"""

from __future__ import annotations

import argparse
from pathlib import Path


def train_func(config: dict) -> None:
    """One Ray Train worker = one dualtrain rank (the in-process path of an external launcher)."""
    from dualtrain.driver.runs import start_run
    from dualtrain.spec import Backend, from_dict

    start_run(from_dict(config["spec"]), Backend(config["backend"]), config["out"])


def trainer(spec, backend: str, out: str | Path):
    """A TorchTrainer (backend torch) or TensorflowTrainer (tf) that trains ``spec`` (an
    Experiment) into ``out`` with its world size."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    common = {
        "train_loop_config": {
            "spec": spec.to_dict(),
            "backend": backend,
            "out": str(Path(out).resolve()),
        },
        "scaling_config": ScalingConfig(
            num_workers=spec.distribution.world_size,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
        ),
        "run_config": RunConfig(
            name=f"dualtrain-{backend}",
            storage_path=str(Path(out).resolve().parent / ".ray"),
            failure_config=FailureConfig(max_failures=0),  # one owner of restarts: dualtrain
        ),
    }
    if backend == "torch":
        from ray.train.torch import TorchConfig, TorchTrainer

        timeout = int(spec.distribution.timeout_s)
        return TorchTrainer(
            train_func, torch_config=TorchConfig(backend="gloo", timeout_s=timeout), **common
        )
    from ray.train.tensorflow import TensorflowTrainer

    return TensorflowTrainer(train_func, **common)


def worker_env(spec, backend: str) -> dict[str, str]:
    """What Ray must give its workers before they import their framework."""
    if backend != "tf":
        return {}
    from dualtrain.backends.tf.launch import preimport_env

    return preimport_env(spec)


def main() -> None:
    import ray

    from dualtrain.spec.load import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["torch", "tf"], default="torch")
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args()
    spec = load_spec(args.config, [f"distribution.world_size={args.world_size}", *args.sets])
    ray.init(
        num_cpus=max(2, args.world_size),
        include_dashboard=False,
        runtime_env={"env_vars": worker_env(spec, args.backend)},
    )
    try:
        trainer(spec, args.backend, args.out).fit()
    finally:
        ray.shutdown()
    print(f"ray: trained {args.out}")


if __name__ == "__main__":
    main()
