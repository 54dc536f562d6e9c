"""The sharding plan: coverage, balance, determinism (hypothesis), and DistributedSampler replay."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualtrain.core.plan import ShardPlan, eval_shards, shard_digest, split_balanced, torch_randperm
from dualtrain.spec import LastBatch, Sharding, load_spec

sizes = st.integers(min_value=1, max_value=300)
batches = st.integers(min_value=1, max_value=64)
worlds = st.integers(min_value=1, max_value=5)


@settings(max_examples=150, deadline=None)
@given(
    n=sizes,
    b=batches,
    w=worlds,
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_exact_mode_each_sample_once(n, b, w, seed, shuffle, epoch):
    plan = ShardPlan(
        num_samples=n,
        global_batch=b,
        world_size=w,
        seed=seed,
        shuffle=shuffle,
        last_batch=LastBatch.KEEP,
    )
    seen = []
    for step in plan.epoch(epoch):
        assert len(step) == w
        sizes_ = [len(ids) for ids in step]
        assert max(sizes_) - min(sizes_) <= 1  # balanced
        assert sizes_ == sorted(sizes_, reverse=True)  # extra ids go to the first replicas
        assert sum(sizes_) <= b
        seen.extend(np.concatenate(step).tolist())
    assert sorted(seen) == list(range(n))  # every id exactly once, no padding
    assert plan.steps_per_epoch == -(-n // b)


@settings(max_examples=100, deadline=None)
@given(n=sizes, b=batches, w=worlds, seed=st.integers(0, 1000))
def test_exact_mode_drop_last(n, b, w, seed):
    plan = ShardPlan(
        num_samples=n, global_batch=b, world_size=w, seed=seed, last_batch=LastBatch.DROP
    )
    steps = list(plan.epoch(0))
    assert len(steps) == n // b
    assert all(sum(len(i) for i in s) == b for s in steps)
    ids = np.concatenate([np.concatenate(s) for s in steps]) if steps else np.array([])
    assert len(set(ids.tolist())) == len(ids)


@settings(max_examples=60, deadline=None)
@given(n=sizes, b=batches, w=worlds, seed=st.integers(0, 1000), epoch=st.integers(0, 5))
def test_deterministic_and_epoch_dependent(n, b, w, seed, epoch):
    a = ShardPlan(num_samples=n, global_batch=b, world_size=w, seed=seed)
    again = ShardPlan(num_samples=n, global_batch=b, world_size=w, seed=seed)
    assert a.digests(epoch) == again.digests(epoch)
    if n >= 8:
        assert not np.array_equal(a.epoch_order(epoch), a.epoch_order(epoch + 1))


@settings(max_examples=100, deadline=None)
@given(n=sizes, w=worlds, per=st.integers(1, 16), seed=st.integers(0, 1000), drop=st.booleans())
def test_torch_sampler_mode_structure(n, w, per, seed, drop):
    plan = ShardPlan(
        num_samples=n,
        global_batch=per * w,
        world_size=w,
        seed=seed,
        last_batch=LastBatch.DROP if drop else LastBatch.KEEP,
        mode=Sharding.TORCH_SAMPLER,
    )
    steps = list(plan.epoch(0))
    for step in steps:
        sizes_ = {len(ids) for ids in step}
        assert len(sizes_) == 1  # DistributedSampler: every rank the same size
    ids = np.concatenate([np.concatenate(s) for s in steps]) if steps else np.array([], dtype=int)
    if not drop:
        assert set(ids.tolist()) == set(range(n))  # padded: all ids, some twice
        assert len(ids) == -(-n // w) * w


def test_partial_last_batch_with_empty_replicas():
    plan = ShardPlan(num_samples=130, global_batch=128, world_size=3, seed=0)
    last = plan.step_ids(0, 1)
    assert [len(i) for i in last] == [1, 1, 0]


def test_randperm_matches_known_torch_output():
    # torch.randperm(10, generator=torch.Generator().manual_seed(0)) (also in parity-semantics.md)
    assert torch_randperm(10, 0).tolist() == [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]


def test_split_and_eval_shards():
    parts = split_balanced(np.arange(7), 3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4], [5, 6]]
    assert eval_shards(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_digest_is_order_sensitive():
    assert shard_digest(np.array([1, 2])) != shard_digest(np.array([2, 1]))
    assert shard_digest(np.array([], dtype=np.int64)) == shard_digest(np.array([], dtype=np.int32))


def test_from_spec():
    spec = load_spec(None, ["distribution.world_size=2", "data.batch_size=64", "seed=5"])
    plan = ShardPlan.from_spec(spec, 1000)
    assert (plan.world_size, plan.global_batch, plan.seed) == (2, 64, 5)
    assert plan.steps_per_epoch == 16


@pytest.mark.parametrize("n,w,per", [(10, 4, 2), (7, 3, 1), (100, 3, 5)])
def test_torch_sampler_known_example(n, w, per):
    # DistributedSampler semantics written out by hand from parity-semantics.md §1.
    plan = ShardPlan(
        num_samples=n, global_batch=w * per, world_size=w, seed=0, mode=Sharding.TORCH_SAMPLER
    )
    order = torch_randperm(n, 0).tolist()
    total = -(-n // w) * w
    padded = (order * (total // n + 1))[:total]
    for r in range(w):
        mine = padded[r:total:w]
        got = np.concatenate([plan.step_ids(0, k)[r] for k in range(plan.steps_per_epoch)]).tolist()
        assert got == mine
