"""sharding=torch_sampler: the plan equals real DistributedSampler + DataLoader ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dualtrain.core.plan import ShardPlan
from dualtrain.spec import LastBatch, Sharding


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("n,per_rank", [(103, 4), (60, 5), (7, 3)])
def test_plan_equals_distributed_sampler(world, drop, n, per_rank):
    seed = 11
    plan = ShardPlan(
        num_samples=n,
        global_batch=per_rank * world,
        world_size=world,
        seed=seed,
        shuffle=True,
        last_batch=LastBatch.DROP if drop else LastBatch.KEEP,
        mode=Sharding.TORCH_SAMPLER,
    )
    dataset = list(range(n))
    firsts = []
    for epoch in range(3):
        per_rank_batches = []
        for rank in range(world):
            sampler = DistributedSampler(
                dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=drop
            )
            sampler.set_epoch(epoch)
            loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=drop)
            per_rank_batches.append([b.tolist() for b in loader])
        steps = list(plan.epoch(epoch))
        assert len(steps) == len(per_rank_batches[0]) == plan.steps_per_epoch
        for k, step in enumerate(steps):
            for rank in range(world):
                assert step[rank].tolist() == per_rank_batches[rank][k], (epoch, k, rank)
        firsts.append(plan.epoch_order(epoch).tolist())
    assert firsts[0] != firsts[1]  # set_epoch matters: a new order each epoch


def test_randperm_matches_torch():
    from dualtrain.core.plan import torch_randperm

    for n, seed in ((1, 0), (17, 3), (1000, 12345)):
        g = torch.Generator().manual_seed(seed)
        assert np.array_equal(torch_randperm(n, seed), torch.randperm(n, generator=g).numpy())
