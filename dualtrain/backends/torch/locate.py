"""The locator's torch side (dualtrain.core.locate): a model pair's torch module probed on one batch
in float64, module by module (what each leaf module takes and makes, in inference and in training,
its activation, the running statistics, the gradients), for the driver to find where the two sides
first part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from dualtrain.core import losses
from dualtrain.core.locate.mistakes import ACTIVATION_PROBE
from dualtrain.spec import Experiment

from .ops import LOSS_OPS
from .pair import build_module, load_pair


def _attention_hook(
    name: str, tag: str, out: dict[str, np.ndarray]
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], None]:
    """An nn.MultiheadAttention's first self-attention call, as torch computes it: its input
    (``in/``), output (``out/``), the attention mask it was given (``mask/``, True = masked), its
    packed projection x W^T + b (``proj/``: what a port's Dense of 3 x width makes) and the heads'
    context before out_proj (``in/NAME.out_proj``; ``out/NAME.out_proj`` is the output). Its
    functional forward calls no module: these are computed here, with torch's own ops, from its
    weights."""

    def record(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        assert isinstance(m, nn.MultiheadAttention)
        x = args[0] if args else kwargs.get("query")
        if f"{tag}in/{name}" in out or not isinstance(x, torch.Tensor):
            return
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        with torch.no_grad():
            proj = nn.functional.linear(x, m.in_proj_weight, m.in_proj_bias)
            n, t, e = proj.shape[0], proj.shape[1], m.embed_dim
            q, k, v = (
                a.reshape(n, t, m.num_heads, e // m.num_heads).transpose(1, 2)
                for a in proj.split(e, dim=-1)
            )
            keep = None
            if mask is not None:  # torch's polarity: True (or -inf) = masked
                keep = ~mask if mask.dtype == torch.bool else mask
            ctx = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            ctx = ctx.transpose(1, 2).reshape(n, t, e)
        y = result[0] if isinstance(result, tuple) else result
        out[f"{tag}in/{name}"] = x.detach().numpy().copy()
        out[f"{tag}out/{name}"] = y.detach().numpy().copy()
        out[f"{tag}proj/{name}"] = proj.numpy().copy()
        out[f"{tag}in/{name}.out_proj"] = ctx.numpy().copy()
        out[f"{tag}out/{name}.out_proj"] = out[f"{tag}out/{name}"]
        if mask is not None:
            out[f"{tag}mask/{name}"] = mask.detach().numpy().copy()

    return record


def probe_layers(
    spec: Experiment, weights: dict[str, np.ndarray], inputs: list[np.ndarray], y: np.ndarray
) -> dict[str, np.ndarray]:
    """The locator's torch side (dualtrain.core.locate), in float64, on one batch: every leaf
    module's first call in an inference forward (``in/``, ``out/``: by module name) and in a
    training forward (``tin/``, ``tout/``), the model's output in both (``output/eval``,
    ``output``), the running statistics after the training forward (``running/``), and each
    parameter's gradient of the run's loss (sum over the batch / N) in training mode, as a step
    computes it."""
    module = build_module(spec.model, spec.seed).to(torch.float64)
    load_pair(module, weights)
    out: dict[str, np.ndarray] = {}
    leaves = [(n, m) for n, m in module.named_modules() if n and not list(m.children())]

    def forward(tag: str) -> torch.Tensor:
        def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
            def record(m: nn.Module, args: tuple[Any, ...], result: Any) -> None:
                if f"{tag}in/{name}" in out or not args or not isinstance(args[0], torch.Tensor):
                    return
                out[f"{tag}in/{name}"] = args[0].detach().numpy().copy()
                if isinstance(result, torch.Tensor):
                    out[f"{tag}out/{name}"] = result.detach().numpy().copy()

            return record

        handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
        handles += [
            m.register_forward_hook(_attention_hook(n, tag, out), with_kwargs=True)
            for n, m in module.named_modules()
            if isinstance(m, nn.MultiheadAttention)
        ]
        try:
            return module(*xs)
        finally:
            for h in handles:
                h.remove()

    xs = [torch.from_numpy(np.asarray(a, np.float64)) for a in inputs]
    module.eval()  # inference: batchnorm normalises with its running statistics
    with torch.no_grad():
        out["output/eval"] = forward("").numpy().copy()
    module.train()  # training, as a step runs it: batch statistics, running statistics move
    logits = forward("t")
    for name, b in module.named_buffers():
        if name.rsplit(".", 1)[-1] in ("running_mean", "running_var"):
            out[f"running/{name}"] = b.numpy().copy()
    out["output"] = logits.detach().numpy().copy()
    probe = torch.from_numpy(ACTIVATION_PROBE[None, :])
    with torch.no_grad():
        for n, m in leaves:
            if not list(m.parameters(recurse=False)):
                try:  # what a parameter-free leaf does to the probe vector (activations)
                    out[f"act/{n}"] = m(probe).numpy().reshape(-1).copy()
                except Exception:  # flatten, pooling, ...: not an activation
                    continue
        for n, m in module.named_modules():
            # an activation held as a function, not a module: nn.TransformerEncoderLayer(
            # activation="gelu") keeps F.gelu, which no leaf shows
            fn = getattr(m, "activation", None)
            if callable(fn) and not isinstance(fn, nn.Module):
                out[f"act/{n}.activation"] = fn(probe).numpy().reshape(-1).copy()
    target = torch.from_numpy(y)
    loss = losses.loss_sum(LOSS_OPS, spec.model.loss, logits, target)  # float64: its exact form
    (loss / len(y)).backward()
    for name, p in module.named_parameters():
        if p.grad is not None:
            out[f"grad/{name}"] = p.grad.numpy().copy()
    return out
