"""A small torch loop the recorder tests train: a model, one optimizer step, a dataset without a
length."""

from __future__ import annotations

import torch


def model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4)).to(dtype)


def grads(model):
    return [p.grad for p in model.parameters()]


def step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    opt.step()
    return loss


class Stream(torch.utils.data.IterableDataset):
    """Rows without a length (a streaming dataset)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))
