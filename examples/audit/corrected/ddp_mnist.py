"""ddp_mnist.py corrected to train as corrected/keras_mnist.py does (docs/audit.md shows the diff):
each epoch's order is one NumPy permutation both scripts compute, and each rank takes its
contiguous block of every global batch, as MirroredStrategy splits a batch.

The three lines marked AUDIT are all dualtrain adds; the rest is the usual script. Then::

    python examples/audit/ddp_mnist.py --out runs/audit_torch
    python examples/audit/keras_mnist.py --out runs/audit_keras
    dualtrain compare runs/audit_torch runs/audit_keras

The flags after ``--seed`` each plant one classic difference (tests/audit uses them).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Sampler, TensorDataset

import dualtrain.audit  # AUDIT
from dualtrain.core.data import mnist
from dualtrain.spec import DataSpec


class Net(nn.Module):
    def __init__(self, batchnorm: float | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.bn = nn.BatchNorm2d(64, momentum=batchnorm) if batchnorm else nn.Identity()
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.bn(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def mnist_train(size: int) -> TensorDataset:
    arrays = mnist.read_source(mnist.locate(DataSpec()))  # real MNIST, offline
    x = arrays["train_images"][:size].astype(np.float32)[:, None] / 255.0
    x = (x - 0.1307) / 0.3081  # transforms.Normalize((0.1307,), (0.3081,))
    y = arrays["train_labels"][:size].astype(np.int64)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


class BlockSampler(Sampler):
    """Rank ``rank``'s rows of each global batch of ``world * batch`` rows: its contiguous block,
    in an order ``np.random.default_rng(seed + epoch).permutation(n)``; the last partial global
    batch is dropped (drop_remainder=True on the Keras side)."""

    def __init__(self, n: int, batch: int, rank: int, world: int, seed: int, interleave=False):
        self.n, self.batch, self.rank, self.world, self.seed = n, batch, rank, world, seed
        self.epoch, self.interleave = 0, interleave

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng(self.seed + self.epoch).permutation(self.n)
        g = self.batch * self.world
        for start in range(0, self.n - g + 1, g):
            if self.interleave:  # DistributedSampler's way: rows rank, rank + world, ...
                yield from order[start + self.rank : start + g : self.world].tolist()
                continue
            lo = start + self.rank * self.batch
            yield from order[lo : lo + self.batch].tolist()

    def __len__(self) -> int:
        return self.n // (self.batch * self.world) * self.batch


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    dataset = mnist_train(args.train_size)
    sampler = BlockSampler(len(dataset), args.batch_size, rank, world, args.seed, args.interleave)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(Net(args.batchnorm))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale) if args.amp else None
    rec = dualtrain.audit.torch_recorder(  # AUDIT
        args.out,
        model=model,
        optimizer=optimizer,
        scaler=scaler,
        loader=loader,
        scheduler=scheduler,
    )
    step = 0
    for epoch in range(1, args.epochs + 1):
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)
        model.train()
        for data, target in loader:
            rec.batch(data)  # AUDIT
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target, reduction=args.reduction)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                (loss * world if args.sum_replicas else loss).backward()
                optimizer.step()
            rec.step(loss)  # AUDIT
            if args.scheduler_per_step:
                scheduler.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        if not args.scheduler_per_step:
            scheduler.step()
    rec.close()  # AUDIT
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_torch")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-size", type=int, default=4000, help="the first N training images")
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-set-epoch", action="store_true")
    p.add_argument("--scheduler-per-step", action="store_true")
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--reduction", default="mean", choices=["mean", "sum"])
    p.add_argument("--amp", action="store_true", help="GradScaler")
    p.add_argument("--init-scale", type=float, default=2.0**16)
    p.add_argument("--batchnorm", type=float, default=None, help="BatchNorm2d momentum")
    p.add_argument("--interleave", action="store_true", help="split a batch as DistributedSampler")
    p.add_argument("--sum-replicas", action="store_true", help="sum the replicas' gradients")
    p.add_argument("--weight-decay", type=float, default=0.0, help="Adadelta's (an L2 term)")
    args = p.parse_args()
    if "RANK" in os.environ:  # torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(train, args=(args.world_size, args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
