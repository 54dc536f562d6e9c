"""Each input row's digests (dualtrain.audit.identity) in torch, batched over steps so a step
costs one copy kernel."""

from __future__ import annotations

from typing import Any

import torch

from dualtrain.audit.identity import CHUNK, MASK32, multipliers


class Digests:
    """Each row's digests (dualtrain.audit.identity), computed for many steps at once: the
    inputs wait as float32 copies (one kernel per step) until ``STEPS`` steps or ``BYTES`` are
    pending, then a few float64 matrix products digest them all."""

    STEPS, BYTES = 32, 64 * 2**20

    def __init__(self) -> None:
        self.pending: list[tuple[dict[str, Any], torch.Tensor]] = []
        self.bytes = 0
        self.mult: dict[tuple[int, str], torch.Tensor] = {}

    def add(self, row: dict[str, Any], x: torch.Tensor) -> None:
        x = x.detach().reshape(x.shape[0], -1).to(torch.float32, copy=True)
        self.pending.append((row, x))
        self.bytes += x.numel() * 4
        if len(self.pending) >= self.STEPS or self.bytes >= self.BYTES:
            self.flush()

    def flush(self) -> None:
        groups: dict[tuple[int, str], list[tuple[dict[str, Any], torch.Tensor]]] = {}
        for row, x in self.pending:
            groups.setdefault((x.shape[1], str(x.device)), []).append((row, x))
        for key, items in groups.items():
            exact, pattern = self._compute(key, torch.cat([x for _, x in items]))
            sizes = [x.shape[0] for _, x in items]
            for (row, _), e, p in zip(items, exact.split(sizes), pattern.split(sizes), strict=True):
                row["exact"].append(e)
                row["pattern"].append(p)
        self.pending, self.bytes = [], 0

    def _compute(self, key: tuple[int, str], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.mult:
            self.mult[key] = torch.from_numpy(multipliers(key[0])).to(x.device)
        mult = self.mult[key]
        bits = x.view(torch.int32).long() & MASK32
        words = torch.cat([bits & 0xFFFF, bits >> 16], dim=1).double()
        mask = (x > x.min(1, keepdim=True).values).double()
        return _dot(words, mult), _dot(mask, mult[: key[0]])


def _dot(words: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(words.shape[0], 2, dtype=torch.int64, device=words.device)
    for lo in range(0, words.shape[1], CHUNK):
        out += (words[:, lo : lo + CHUNK] @ mult[lo : lo + CHUNK]).long()
    return out & MASK32
