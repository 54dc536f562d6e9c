"""Two DDP processes (gloo, a file store) recording a ZeroRedundancyOptimizer(AdamW) loop:
``python ddp_case.py OUT [--foreign]``. With ``--foreign`` the folder holds a file no recorder
wrote: each process writes its one-line error to ``OUT.rankN.err`` and exits 3."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

import dualtrain.audit
from dualtrain.errors import UserError


def work(rank: int, out: str, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.rand(16, 8), torch.randint(0, 2, (16,)))
    sampler = torch.utils.data.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    try:
        rec = dualtrain.audit.torch_recorder(out, model=model, optimizer=opt, loader=loader)
    except UserError as e:
        Path(f"{out}.rank{rank}.err").write_text(f"{e}\n")
        sys.exit(3)
    for x, y in loader:
        rec.batch(x)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        rec.step(loss)
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = sys.argv[1]
    if "--foreign" in sys.argv:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "notes.txt").write_text("mine\n")
    store = tempfile.mktemp(prefix="ddp_case_store_")
    mp.spawn(work, args=(out, store), nprocs=2)
