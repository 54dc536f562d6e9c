"""dualtrain's TF workers inside Ray Train's TensorflowTrainer, on a Ray cluster (a local one here).

Ray starts the worker processes and sets a worker-only TF_CONFIG in each (no chief task: worker 0
is the chief); each worker then runs the spec exactly as `dualtrain run --backend tf` does in a
TF_CONFIG cluster (MultiWorkerMirroredStrategy, one process per replica). dualtrain owns the
timeout (distribution.timeout_s) and the restarts (Ray's max_failures is 0: rerunning the script
continues the run from its latest checkpoint). Rank 0 writes the run directory, which every worker
must see (one machine here; a shared filesystem on a cluster).

    pip install -e '.[all,ray]' -c constraints.txt
    python examples/ray/tensorflow_trainer.py configs/mnist_mlp.yaml runs/ray-tf --world-size 2
"""

from __future__ import annotations

import argparse
from pathlib import Path


def train_func(config: dict) -> None:
    """One Ray Train worker = one dualtrain rank (the in-process path of an external launcher)."""
    from dualtrain.driver.runs import start_run
    from dualtrain.spec import Backend, from_dict

    start_run(from_dict(config["spec"]), Backend.TF, config["out"])


def trainer(spec, out: str | Path):
    """A TensorflowTrainer that trains ``spec`` (an Experiment) into ``out`` with its world size."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    return TensorflowTrainer(
        train_func,
        train_loop_config={"spec": spec.to_dict(), "out": str(Path(out).resolve())},
        scaling_config=ScalingConfig(
            num_workers=spec.distribution.world_size,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
        ),
        run_config=RunConfig(
            name="dualtrain",
            storage_path=str(Path(out).resolve().parent / ".ray"),
            failure_config=FailureConfig(max_failures=0),  # one owner of restarts: dualtrain
        ),
    )


def preimport_env_of(spec) -> dict[str, str]:
    from dualtrain.backends.tf.launch import preimport_env

    return preimport_env(spec)


def main() -> None:
    import ray

    from dualtrain.spec.load import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args()
    spec = load_spec(args.config, [f"distribution.world_size={args.world_size}", *args.sets])
    # Ray imports TensorFlow in its workers before train_func runs: what dualtrain's TF worker
    # sets before that import (oneDNN's kernels off, for determinism) comes from Ray's runtime_env
    ray.init(
        num_cpus=max(2, args.world_size),
        include_dashboard=False,
        runtime_env={"env_vars": preimport_env_of(spec)},
    )
    try:
        trainer(spec, args.out).fit()
    finally:
        ray.shutdown()
    print(f"ray: trained {args.out}")


if __name__ == "__main__":
    main()
