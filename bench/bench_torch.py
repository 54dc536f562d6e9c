"""Throughput of the dualtrain torch runner vs a plain hand-written 2-process gloo DDP loop.

Both: the MLP preset (784-256-128-10) or, with --model cnn, the CNN preset (conv 32, max-pool,
conv 64, max-pool, dense 128), global batch 128 (64 per rank), full MNIST in memory, fp32,
1 epoch, SGD as in configs/mnist_mlp.yaml, 2 processes with the same threads per process. Both are
timed over the training steps only (no startup, no evaluation): the runner's summary.json
``train_samples_per_s`` and, for the plain loop, samples / wall time from a barrier before the first
step to the end of the last step.

    python bench/bench_torch.py [--repeats N] [--world-size 2] [--model mlp|cnn]

With --repeats N the two are run alternately N times each and the medians are compared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dualtrain.driver.runs import start_run  # noqa: E402
from dualtrain.launch.local import free_port  # noqa: E402
from dualtrain.runtime.start import default_threads  # noqa: E402
from dualtrain.spec import Backend, load_spec  # noqa: E402


def bench_spec(world: int, extra: list[str] | None = None, kind: str = "mlp"):
    return load_spec(
        ROOT / "configs" / "mnist_mlp.yaml",
        [
            "train.epochs=1",
            f"distribution.world_size={world}",
            "precision.dtype=fp32",
            "data.batch_size=128",
            "train.log_every=100",
            f"model.preset={kind}",
            *(extra or []),
        ],
    )


def run_dualtrain(world: int, extra: list[str], kind: str) -> float:
    spec = bench_spec(world, extra, kind)
    with tempfile.TemporaryDirectory() as tmp:
        _, summary = start_run(spec, Backend.TORCH, Path(tmp) / "run")
    return float(summary["train_samples_per_s"])


def plain_model(kind: str):
    """The hand-written loop's model: the same layers as the preset (dualtrain/spec/model.py)."""
    from torch import nn

    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 5 * 5, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def _plain_rank(rank: int, world: int, port: int, threads: int, kind: str, result) -> None:
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dualtrain.core.data import TRAIN, open_data

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(threads)
    if os.environ.get("DUALTRAIN_TORCH_MKLDNN", "").strip() == "0":  # the kernels the runner gets
        torch.backends.mkldnn.enabled = False
    spec = bench_spec(world, kind=kind)
    data = open_data(spec)
    n = data.size(TRAIN)
    x_all = torch.from_numpy(data.inputs(TRAIN, slice(0, n))[0])
    y_all = torch.from_numpy(data.targets(TRAIN, slice(0, n)))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(plain_model(kind))
    opt = torch.optim.SGD(
        model.parameters(), lr=spec.optimizer.lr, momentum=spec.optimizer.momentum
    )
    n, batch = len(y_all), spec.data.batch_size
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    dist.barrier()
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        glob = order[start : start + batch]
        idx = glob.tensor_split(world)[rank]
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        result.put(n / elapsed)
    dist.barrier()
    # no teardown: joining gloo's threads at exit can abort a finished rank ("terminate called
    # without an active exception", dualtrain.runtime.entry.exit_now), which failed a round
    sys.stdout.flush()
    os._exit(0)


def run_plain(world: int, kind: str) -> float:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    result = ctx.SimpleQueue()
    threads = default_threads(world)
    mp.spawn(_plain_rank, args=(world, free_port(), threads, kind, result), nprocs=world, join=True)
    return float(result.get())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra spec override for the dualtrain run (e.g. determinism=false)",
    )
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    args = ap.parse_args()
    ours, plain = [], []
    for i in range(args.repeats):
        ours.append(run_dualtrain(args.world_size, args.extra, args.model))
        plain.append(run_plain(args.world_size, args.model))
        print(
            f"round {i + 1}: dualtrain {ours[-1]:,.0f} samples/s, plain DDP {plain[-1]:,.0f} "
            f"samples/s, ratio {ours[-1] / plain[-1]:.3f}",
            flush=True,
        )
    a, b = statistics.median(ours), statistics.median(plain)
    spread = ", ".join(f"{x:,.0f}" for x in ours)
    print(f"dualtrain torch runner ({args.model}): {a:,.0f} samples/s (median of {spread})")
    spread = ", ".join(f"{x:,.0f}" for x in plain)
    print(f"plain gloo DDP loop ({args.model}):    {b:,.0f} samples/s (median of {spread})")
    print(f"ratio: {a / b:.3f} (target >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
