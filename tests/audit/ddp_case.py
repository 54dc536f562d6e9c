"""Two DDP processes (gloo, a file store) recording a ZeroRedundancyOptimizer(AdamW) loop:
``python ddp_case.py OUT [--foreign | --chief-only | --before-init | --bypass | --apart]``. With
``--bypass`` the forward goes through ``model.module`` (DDP never averages the gradients); with
``--apart`` each rank seeds its own model, which no DDP wraps, and averages the gradients by hand
(the replicas start apart). A process whose recorder
refuses writes its one-line error to ``OUT.rankN.err`` and exits 3: with ``--foreign`` (the
folder holds a file no recorder wrote) both; with ``--chief-only`` (rank 1 makes no recorder)
rank 0; with ``--before-init`` (each makes its recorder, into ``OUT.rankN``, before
``init_process_group``) both, at the first ``rec.batch``. With ``--rank1-fails`` rank 1's
recorder fails at its second step (a failure of its own, planted), and both train on."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

import dualtrain.audit
from dualtrain.errors import UserError


def refused(out: str, rank: int, e: UserError) -> None:
    Path(f"{out}.rank{rank}.err").write_text(f"{e}\n")
    sys.exit(3)


def work(rank: int, out: str, store: str, mode: str) -> None:
    torch.manual_seed(rank if mode == "--apart" else 0)
    inner = torch.nn.Linear(8, 2)
    early = None
    if mode == "--before-init":
        early = torch.optim.SGD(inner.parameters(), lr=0.1)
        rec = dualtrain.audit.torch_recorder(f"{out}.rank{rank}", model=inner, optimizer=early)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = inner if mode == "--apart" else torch.nn.parallel.DistributedDataParallel(inner)
    forward = model.module if mode == "--bypass" else model
    torch.manual_seed(0)  # the same rows on every rank
    opt = early or ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3
    )
    if mode == "--apart":  # (ZeroRedundancyOptimizer would broadcast each rank's shard)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.rand(16, 8), torch.randint(0, 2, (16,)))
    sampler = torch.utils.data.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    if early is None and (mode != "--chief-only" or rank == 0):
        try:
            rec = dualtrain.audit.torch_recorder(out, model=model, optimizer=opt, loader=loader)
        except UserError as e:
            refused(out, rank, e)
    elif early is None:  # rank 1 of --chief-only: trains without a recorder
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return
    if mode == "--rank1-fails" and rank == 1:
        add, calls = rec.digests.add, [0]

        def planted(*args):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("planted in rank 1's recorder")
            add(*args)

        rec.digests.add = planted
    for x, y in loader:
        try:
            rec.batch(x)
        except UserError as e:
            rec.__exit__(UserError, e, None)  # as a `with` block left by the error
            refused(out, rank, e)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        if mode == "--apart":
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= 2
        opt.step()
        rec.step(loss)
    rec.close()
    Path(f"{out}.rank{rank}.weight").write_text(repr(inner.weight.detach().sum().item()))
    dist.destroy_process_group()


if __name__ == "__main__":
    out = sys.argv[1]
    if "--foreign" in sys.argv:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "notes.txt").write_text("mine\n")
    store = tempfile.mktemp(prefix="ddp_case_store_")
    modes = [m for m in sys.argv[2:] if m.startswith("--")]
    os.environ["DUALTRAIN_AUDIT_WAIT_S"] = "3"  # the lone recorder's wait (its default: 120 s)
    mp.spawn(work, args=(out, store, modes[0] if modes else ""), nprocs=2)
