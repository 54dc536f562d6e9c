"""How the torch recorder knows each step's epoch, and the sampler's order within it: the
script's ``epoch=``, else a new epoch where the sampler's ``set_epoch`` moved, a new loop over the
DataLoader began, or the loader's length of batches is done. It also keeps the sampler's epoch at
each epoch's first batch (the evidence for a forgotten ``set_epoch``)."""

from __future__ import annotations

import sys
from typing import Any

import torch

from dualtrain.backends.torch.audit_watch import LoaderLoops

NO_EPOCHS = (
    "dualtrain audit: no loader or sampler given and no rec.batch(..., epoch=): every step is "
    "counted in epoch 1 and compare judges the steps' total only (give the recorder loader=, "
    "or rec.batch(data, epoch=epoch))"
)


class Epochs:
    """The epoch of each batch, and the batch's dataset indices read from a deterministic
    sampler's order."""

    def __init__(self, sampler: Any, batches: int | None, batch_size: Any, loops: LoaderLoops):
        self.sampler, self.batches, self.batch_size, self.loops = (
            sampler,
            batches,
            batch_size,
            loops,
        )
        self.now, self.pos = 0, 0
        self.order: list[int] | None = None
        self.sampler_epoch = getattr(sampler, "epoch", None)
        self.sampler_epochs: list[Any] = []  # its epoch at each epoch's first batch
        self.set_epoch = hasattr(sampler, "set_epoch")
        known = self.batches or self.set_epoch or loops.ok
        self.kind = "counted" if known else "unknown"
        """How epochs are known: counted, the script's, or unknown."""

    def of(self, epoch: int | None, first: bool) -> int:
        """The epoch of this batch (``first``: the run's first, on rank 0): the script's; else a
        new one when the sampler's epoch moved (``set_epoch``: a loop that leaves its epochs
        early) or the loader's length of batches is done."""
        if epoch is None and self.kind == "unknown" and first:
            print(NO_EPOCHS, file=sys.stderr)
        if epoch is not None:
            self.kind = "script"
        if epoch is None:
            moved, began = getattr(self.sampler, "epoch", None), self.loops.began()
            full = bool(self.batches) and self.pos >= (self.batches or 0)
            new = self.now == 0 or moved != self.sampler_epoch
            new = new or (full if began is None else began)  # a new loop over the loader
            self.sampler_epoch = moved
            epoch = self.now + 1 if new else self.now
        if epoch != self.now:
            self.now, self.pos, self.order = epoch, 0, None
            self.sampler_epochs.append(getattr(self.sampler, "epoch", None))
        return epoch

    def indices(self, n: int) -> list[int] | None:
        """The dataset indices of this batch's ``n`` rows, from the sampler's order (None for a
        sampler whose iteration could draw from the script's RNG)."""
        deterministic = (torch.utils.data.DistributedSampler, torch.utils.data.SequentialSampler)
        if not isinstance(self.sampler, deterministic) or not self.batch_size:
            return None
        if self.pos == 0 or self.order is None:
            self.order = [int(i) for i in iter(self.sampler)]
        start = self.pos * self.batch_size
        got = self.order[start : start + n]
        return got if len(got) == n else None

    def summary(self, config: dict[str, Any]) -> None:
        """The config's ``epochs`` (how they were known) and the sampler's epochs."""
        if self.kind == "counted" and not (self.batches or self.loops.n or self.set_epoch):
            self.kind = "unknown"  # counted by loops over a loader the script never looped
        config["epochs"] = self.kind
        if "sampler" in config:
            config["sampler"]["epochs"] = self.sampler_epochs
