"""dualtrain's torch workers inside Ray Train's TorchTrainer, on a Ray cluster (a local one here).

Ray starts the worker processes, sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) and creates the gloo process group itself; each worker then runs the
spec exactly as `dualtrain run` does under torchrun, and adopts that process group instead of
creating a second one. Ray owns the process group and its timeout (TorchConfig.timeout_s, set
from the spec's distribution.timeout_s); dualtrain owns the restarts (Ray's max_failures is 0:
rerunning the script continues the run from its latest checkpoint). Rank 0 writes the run
directory, which every worker must see (one machine here; a shared filesystem on a cluster).

    pip install -e '.[all,ray]' -c constraints.txt
    python examples/ray/torch_trainer.py configs/mnist_mlp.yaml runs/ray-mnist --world-size 2
"""

from __future__ import annotations

import argparse
from pathlib import Path


def train_func(config: dict) -> None:
    """One Ray Train worker = one dualtrain rank (the in-process path of an external launcher)."""
    from dualtrain.driver.runs import start_run
    from dualtrain.spec import Backend, from_dict

    start_run(from_dict(config["spec"]), Backend.TORCH, config["out"])


def trainer(spec, out: str | Path):
    """A TorchTrainer that trains ``spec`` (an Experiment) into ``out`` with its world size."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        train_func,
        train_loop_config={"spec": spec.to_dict(), "out": str(Path(out).resolve())},
        scaling_config=ScalingConfig(
            num_workers=spec.distribution.world_size,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
        ),
        torch_config=TorchConfig(backend="gloo", timeout_s=int(spec.distribution.timeout_s)),
        run_config=RunConfig(
            name="dualtrain",
            storage_path=str(Path(out).resolve().parent / ".ray"),
            failure_config=FailureConfig(max_failures=0),  # one owner of restarts: dualtrain
        ),
    )


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
    ray.init(num_cpus=max(2, args.world_size), include_dashboard=False, log_to_driver=True)
    try:
        trainer(spec, args.out).fit()
    finally:
        ray.shutdown()
    print(f"ray: trained {args.out}")


if __name__ == "__main__":
    main()
