"""The sharding plan: which sample ids every replica trains on at every step (framework-free).

Both backends feed exactly these ids; neither a DataLoader sampler nor tf.data auto-sharding
decides.

Epoch order
    ``shuffle``: the permutation
    ``torch.randperm(N, generator=Generator().manual_seed(seed + epoch))``, reproduced bit for bit
    in NumPy (MT19937 + the same Fisher-Yates loop), so the order equals DistributedSampler's. No
    shuffle: ``0..N-1``.

Gradient accumulation (``train.accumulate: K``)
    A step's global batch is ``K x data.batch_size`` (everything below with ``B`` that size);
    each replica's ids of a step are then cut into K contiguous, balanced micro-batches
    (:func:`micro_batches`), one forward and backward each.

Mode ``exact`` (default)
    Global step k takes ``order[k*B:(k+1)*B]``. Every sample appears exactly once per epoch; a
    partial last batch is kept (``last_batch: keep``) or dropped. A global batch of n ids is split
    into contiguous, balanced pieces: replica r gets ``n // W`` ids, plus one if ``r < n % W``. When
    ``n < W`` the trailing replicas get none.

Mode ``torch_sampler``
    ``DistributedSampler(num_replicas=W, rank=r, shuffle, seed, drop_last)`` feeding a
    ``DataLoader(batch_size=B // W, drop_last)``, with ``drop_last = (last_batch == "drop")`` for
    both: the order is padded by repeating its head (or truncated) to a multiple of W, rank r takes
    ``order[r::W]`` and cuts it into batches of ``B // W``. Padded samples are seen twice per epoch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dualtrain.spec import Experiment, LastBatch, Sharding


def torch_randperm(n: int, seed: int) -> np.ndarray:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` on CPU, in NumPy.

    torch's CPU randperm runs Fisher-Yates with ``mt19937() % (n - i)``; torch seeds mt19937 with
    the low 32 bits of the seed, like NumPy's legacy MT19937 seeding. Checked against torch in the
    tests for n < 2**24 (larger n may take another path in torch).
    """
    bits = np.random.MT19937()
    bits._legacy_seeding(seed & 0xFFFFFFFF)
    raw = bits.random_raw(max(n - 1, 0)).astype(np.int64)
    r = list(range(n))
    for i in range(n - 1):
        z = i + int(raw[i]) % (n - i)
        r[i], r[z] = r[z], r[i]
    return np.asarray(r, dtype=np.int64)


def shard_digest(ids: np.ndarray) -> str:
    """A short, order-sensitive digest of a replica's sample ids (int64 little-endian, sha256)."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class ShardPlan:
    num_samples: int
    global_batch: int
    world_size: int
    seed: int = 0
    shuffle: bool = True
    last_batch: LastBatch = LastBatch.KEEP
    mode: Sharding = Sharding.EXACT

    accumulate: int = 1
    """Micro-batches per step (train.accumulate): a step's global batch is accumulate x
    data.batch_size, and each replica's ids of a step are cut into this many micro-batches
    (:func:`micro_batches`)."""

    @classmethod
    def from_spec(cls, spec: Experiment, num_samples: int) -> ShardPlan:
        return cls(
            num_samples=num_samples,
            global_batch=spec.data.batch_size * spec.train.accumulate,
            accumulate=spec.train.accumulate,
            world_size=spec.distribution.world_size,
            seed=spec.seed,
            shuffle=spec.data.shuffle,
            last_batch=spec.data.last_batch,
            mode=spec.data.sharding,
        )

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.global_batch < 1 or self.world_size < 1:
            raise ValueError(f"bad plan sizes: {self}")
        if self.mode is Sharding.TORCH_SAMPLER and self.global_batch % self.world_size:
            raise ValueError("torch_sampler mode needs global_batch % world_size == 0")

    # ---- sizes -----------------------------------------------------------------------------------
    @property
    def drop_last(self) -> bool:
        return self.last_batch is LastBatch.DROP

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.world_size

    @property
    def _sampler_num_samples(self) -> int:
        n, w = self.num_samples, self.world_size
        if self.drop_last and n % w:
            return math.ceil((n - w) / w)
        return math.ceil(n / w)

    @property
    def steps_per_epoch(self) -> int:
        if self.mode is Sharding.EXACT:
            full, rem = divmod(self.num_samples, self.global_batch)
            return full + (1 if rem and not self.drop_last else 0)
        full, rem = divmod(self._sampler_num_samples, self.per_rank_batch)
        return full + (1 if rem and not self.drop_last else 0)

    def step_sizes(self, step: int) -> list[int]:
        """How many ids every replica gets at ``step`` (0-based within an epoch; the same in every
        epoch), without building the order."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside 0..{self.steps_per_epoch - 1}")
        if self.mode is Sharding.EXACT:
            n = min(self.global_batch, self.num_samples - step * self.global_batch)
            base, rem = divmod(n, self.world_size)
            return [base + (1 if r < rem else 0) for r in range(self.world_size)]
        b = self.per_rank_batch
        return [min(b, self._sampler_num_samples - step * b)] * self.world_size

    # ---- ids -------------------------------------------------------------------------------------
    def epoch_order(self, epoch: int) -> np.ndarray:
        return _order(self.num_samples, self.seed + epoch, self.shuffle)

    def step_ids(self, epoch: int, step: int) -> list[np.ndarray]:
        """Sample ids of every replica at ``step`` (0-based, within ``epoch``)."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside 0..{self.steps_per_epoch - 1}")
        if self.mode is Sharding.EXACT:
            order = self.epoch_order(epoch)
            batch = order[step * self.global_batch : (step + 1) * self.global_batch]
            return split_balanced(batch, self.world_size)
        per_rank = self._rank_orders(epoch)
        b = self.per_rank_batch
        return [ranks[step * b : (step + 1) * b] for ranks in per_rank]

    def epoch(self, epoch: int) -> Iterator[list[np.ndarray]]:
        for step in range(self.steps_per_epoch):
            yield self.step_ids(epoch, step)

    def _rank_orders(self, epoch: int) -> list[np.ndarray]:
        order = self.epoch_order(epoch)
        total = self._sampler_num_samples * self.world_size
        if not self.drop_last:
            pad = total - len(order)
            if pad > 0:
                reps = math.ceil(pad / len(order))
                order = np.concatenate([order, np.tile(order, reps)[:pad]])
        else:
            order = order[:total]
        return [order[r : total : self.world_size] for r in range(self.world_size)]

    def digests(self, epoch: int) -> list[list[tuple[str, int]]]:
        """[(digest, count) per replica] for every step of ``epoch``: what shards.jsonl must
        record."""
        return [[(shard_digest(ids), len(ids)) for ids in step] for step in self.epoch(epoch)]


@lru_cache(maxsize=4)
def _order(n: int, seed: int, shuffle: bool) -> np.ndarray:
    order = torch_randperm(n, seed) if shuffle else np.arange(n, dtype=np.int64)
    order.setflags(write=False)
    return order


def split_balanced(batch: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Contiguous pieces, sizes n//W (+1 for the first n%W replicas)."""
    n = len(batch)
    base, rem = divmod(n, world_size)
    out, start = [], 0
    for r in range(world_size):
        size = base + (1 if r < rem else 0)
        out.append(batch[start : start + size])
        start += size
    return out


def micro_batches(ids: np.ndarray, accumulate: int) -> list[np.ndarray]:
    """One replica's ids of one optimizer step cut into ``accumulate`` micro-batches
    (train.accumulate): contiguous, balanced (the first ``n % K`` one longer), in the plan's order,
    so the step's ids are the same whatever K is. A replica with fewer ids than K has empty
    trailing micro-batches. Both backends feed exactly these."""
    return split_balanced(ids, accumulate)


def micro_sizes(count: int, accumulate: int) -> list[int]:
    """The sizes :func:`micro_batches` gives ``count`` ids (shards.jsonl's ``micro``)."""
    base, rem = divmod(count, accumulate)
    return [base + (1 if j < rem else 0) for j in range(accumulate)]


def eval_shards(num_samples: int, world_size: int) -> list[tuple[int, int]]:
    """Evaluation split: replica r scores the contiguous range [start, stop) (balanced,
    disjoint)."""
    base, rem = divmod(num_samples, world_size)
    out, start = [], 0
    for r in range(world_size):
        size = base + (1 if r < rem else 0)
        out.append((start, start + size))
        start += size
    return out
